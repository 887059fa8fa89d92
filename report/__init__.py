"""
What evaluate.py prints and draws besides Table 1 (the wall clock, the step view, the γ sweep),
and the main job over several seeds (python -m report.seeds).
"""
