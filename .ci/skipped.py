"""The tests a pytest run skipped, as node ids, one per line, from its --junitxml report.

    python .ci/skipped.py report.xml    # -> tests/test_gguf.py, tests/test_x.py::test_y[2], ...

CI runs the suite once without the optional packages (each test that needs one must skip), then
installs them and runs only what skipped: the rest has already passed.
"""

import sys
import xml.etree.ElementTree as ET


def node_id(case):
    """A <testcase> -> its pytest node id. A module skipped at collection has no classname and the
    module's dotted name as its name; a test's classname is its module's dotted name."""
    if not case.get("classname"):
        return case.get("name").replace(".", "/") + ".py"
    return case.get("classname").replace(".", "/") + ".py::" + case.get("name")


if __name__ == "__main__":
    cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
    print("\n".join(sorted({node_id(c) for c in cases if c.find("skipped") is not None})))
