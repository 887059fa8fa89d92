"""
evaluate.py's calibration rule and seeds.py's summary, on hand-made sweeps and reports (no model
needed).
"""

import json

import pytest

import evaluate
import report.seeds as seeds
import report.summary as summary
import report.sweep as sweep_picture
import report.views as views
import tiny_models
from serving.settings import ServingSettings


def sweep(*points):
    """[(γ, result)] from (γ, val accuracy, tokens per forward) triples, as calibrate() makes it."""
    return [(g, dict(accuracy=acc, tokens=round(tpf * 1000), forwards=1000))
            for g, acc, tpf in points]


def test_gamma_is_the_largest_with_no_failure_below_it():
    s = sweep((3e-4, 99.9, 2.0), (1e-3, 99.7, 4.0), (2e-3, 99.2, 6.0), (3e-3, 99.8, 7.0),
              (5e-3, 97.0, 8.0))
    assert evaluate.within_budget(s, 99.5) == 1e-3  # 3e-3 passes again, but after 2e-3 failed
    assert evaluate.within_budget(s, 98.0) == 3e-3
    assert evaluate.within_budget(s, 96.0) == 5e-3


def test_no_gamma_when_the_first_fails_or_nothing_is_faster_than_ntp():
    assert evaluate.within_budget(sweep((3e-4, 98.0, 2.0), (1e-3, 99.9, 4.0)), 99.5) is None
    assert evaluate.within_budget(sweep((3e-4, 99.9, 0.99)), 99.5) is None  # slower than NTP


def exact_sweep(*points):
    """[(γ, floor, result)] from (γ, floor, tokens per forward), as calibrate() makes it."""
    return [(g, floor, r) for (_, r), (g, floor, _) in zip(sweep(*points), points)]


def test_exact_gamma_has_the_fewest_forwards_and_of_a_tie_the_largest():
    s = exact_sweep((0.01, 0, 11.0), (0.1, 0, 12.0), (1.0, 0, 12.0), (1e9, 0, 12.0))
    assert evaluate.fastest_exact(s) == (1e9, 0)  # the reveal rule is skipped at the same speed
    assert evaluate.fastest_exact(exact_sweep((0.01, 0, 12.0), (1e9, 0, 11.5))) == (0.01, 0)
    assert evaluate.fastest_exact(exact_sweep((1e9, 0, 3.0), (0.1, 0, 3.0))) == (1e9, 0)
    # the draft floor: the fewest forwards, of a tie the lowest floor (no cut)
    s = exact_sweep((1e9, 0.0, 2.0), (1e9, 0.5, 2.6), (1e9, 0.9, 2.6), (0.1, 0.5, 2.7))
    assert evaluate.fastest_exact(s) == (0.1, 0.5)
    assert evaluate.fastest_exact(s[:3]) == (1e9, 0.5)


def test_row_keys_drop_the_gamma_values():
    names = {"NTP baseline": "NTP baseline", "SBD k=16 γ_low=0.01": "SBD k=16 γ_low",
             "SBD k=8 γ_high: no γ within 2.0 points on val": "SBD k=8 γ_high",
             "SBD exact k=16 γ=1e+09": "SBD exact k=16",
             "SBD exact k=16 γ=1e+09 p≥0.7": "SBD exact k=16"}
    for name, key in names.items():
        assert summary.row_key(name) == key


def test_seed_summary_is_mean_min_max_per_row(tmp_path, capsys):
    runs = []
    results = [(99.0, 10.0, "0.01"), (98.0, 6.0, "0.003"), (97.0, 8.0, None)]
    for seed, (acc, speedup, low) in enumerate(results):
        measured = dict(accuracy=acc, delta=acc - 99.5, speedup=speedup) if low else {}
        rows = [dict(name="NTP baseline", key="NTP baseline", accuracy=99.5, delta=0.0,
                     speedup=1.0),
                dict(name=f"SBD k=16 γ_low={low}" if low
                     else "SBD k=16 γ_low: no γ within 0.5 points on val",
                     key="SBD k=16 γ_low", **measured)]
        run = tmp_path / f"run{seed}"
        run.mkdir()
        (run / "report.json").write_text(json.dumps(dict(rows=rows, seconds=60.0 * (seed + 1))))
        runs.append(str(run))
    seeds.summarize(runs)
    out = capsys.readouterr().out
    low_line = next(line for line in out.splitlines() if line.startswith("SBD k=16 γ_low"))
    # the two runs with a row
    assert "98.50 [98.00, 99.00]" in low_line and "8.00x [6.00x, 10.00x]" in low_line
    assert "0.01 0.003 -" in low_line and "1 of 3 runs: no γ met the budget" in low_line
    assert "report time per run: 2.0 [1.0, 3.0] min" in out
    ntp_line = next(line for line in out.splitlines() if line.startswith("NTP baseline"))
    assert ntp_line.rstrip().endswith("1.00x [1.00x, 1.00x]")  # no γ column for a row without a γ


def hand_made_curves():
    """sweep_picture.curves' layout: k=8 with a choice and a cliff, k=16 lossless to the end."""
    return {8: dict(low=1e-3, high=2e-3, exact=6.5,
                    points=[(3e-4, 99.8, 2.0), (1e-3, 99.6, 4.0), (2e-3, 98.5, 6.0),
                            (1e9, 80.0, 7.5)]),
            16: dict(low=None, high=None, exact=10.9,
                     points=[(3e-4, 99.9, 1.7), (1e9, 99.9, 15.0)])}


def test_sweep_picture_is_written_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    path = sweep_picture.plot_sweep(hand_made_curves(), 99.9, 0.5, str(tmp_path / "sweep.png"))
    assert path and (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_picture_without_matplotlib_says_how_to_get_it(tmp_path, monkeypatch, capsys):
    import builtins
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    path = str(tmp_path / "sweep.png")
    assert sweep_picture.plot_sweep(hand_made_curves(), 99.9, 0.5, path) is None
    assert "pip install matplotlib" in capsys.readouterr().out
    assert not (tmp_path / "sweep.png").exists()


def test_paired_statistics_by_hand():
    """Two rows on 6 problems: the row solves 2 the reference misses and misses 1 it solves."""
    row = [True, True, True, False, True, False]
    ref = [True, False, False, True, True, False]
    s = summary.paired(row, ref)
    d = [0, 1, 1, -1, 0, 0]  # mean 1/6, sample variance (sum (d - 1/6)^2) / 5
    var = sum((x - 1 / 6) ** 2 for x in d) / 5
    assert s["delta"] == pytest.approx(100 / 6)
    assert s["se"] == pytest.approx(100 * (var / 6) ** 0.5)
    assert (s["gained"], s["lost"]) == (2, 1)
    assert s["p"] == pytest.approx(1.0)  # 3 discordant, 2 vs 1: P(<= 1 of 3) * 2 = 0.5 * 2
    assert summary.mcnemar(10, 0) == pytest.approx(2 / 2 ** 10)
    assert summary.mcnemar(0, 0) == 1.0
    assert summary.paired(ref, ref)["se"] == 0.0


def test_agreement_is_with_the_sbd_models_own_ntp_decoding(capsys):
    """The 'agree' column compares each row with the row named 'SBD model, NTP decoding', also
    when a reference row (the model as loaded) is inserted before it."""
    def result(completions, correct):
        return dict(completions=completions, correct=correct)
    rows = [("NTP baseline", result(["a", "b", "c", "d"], [True, True, False, False])),
            ("SmolLM2 as loaded, NTP decoding", result(["w", "x", "y", "z"], [False] * 4)),
            ("SBD model, NTP decoding", result(["a", "b", "e", "f"], [True, True, True, False])),
            ("SBD exact k=8 γ=1e+09", result(["a", "b", "e", "g"], [True, True, True, False]))]
    summary.print_paired(rows)
    lines = {line.split("  ")[0].strip(): line for line in capsys.readouterr().out.splitlines()}
    assert lines["SmolLM2 as loaded, NTP decoding"].endswith("agree   0.0%")
    assert lines["SBD model, NTP decoding"].endswith("agree 100.0%")
    assert lines["SBD exact k=8 γ=1e+09"].endswith("agree  75.0%")


@pytest.mark.parametrize("compiled, calls", [(False, 1), (True, 2)])
def test_a_compiled_decoder_is_timed_after_an_untimed_pass(monkeypatch, compiled, calls):
    """The first forward of each width compiles: that is not decoding time."""
    seconds = iter([100.0, 1.0])  # what each decoding of the problems took
    made = []
    monkeypatch.setattr(views, "solve", lambda *a, **kw: made.append(kw) or
                        dict(seconds=next(seconds)))
    settings = ServingSettings(mask_id=0, k=4, compiled=compiled)
    got = views.seconds_at_batch_1(None, None, ["a problem"], settings)
    assert len(made) == calls and all(kw["batch_size"] == 1 for kw in made)
    assert got == (1.0 if compiled else 100.0)


def test_on_a_cpu_the_batches_decode_eager_and_the_batch_1_clock_as_asked():
    """A batch is compute-bound on a CPU: compiled graphs would only add a compile per shape."""
    model = tiny_models.random_model("llama-tiny", 0)
    o = dict(compile=True, weights="trained", quantized_rows=1)
    assert evaluate.fast_decoding([model], {}, o) == (False, True)
    assert evaluate.fast_decoding([model], {}, dict(o, compile=False)) == (False, False)
