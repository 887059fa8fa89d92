"""
What evaluate.py shows besides Table 1: the wall clock of NTP, SBD and exact SBD decoding one
problem at a time, and one problem decoded step by step (the paper's Figure 2b).
"""

import torch

from serving.batched import format_steps
from serving.exact import decode
from tasks.solve import mode_name, new_tokens, solve


def exact_settings(base, k, chosen):
    """The exact mode at block size k as calibrated (chosen: evaluate.calibrate's record)."""
    return base.replace(k=k, gamma=chosen["exact"], exact=True,
                        min_draft_prob=chosen.get("exact_floor", 0.0))


def exact_name(chosen):
    """'γ=...' of a calibrated exact mode, with its draft floor if it has one."""
    floor = chosen.get("exact_floor", 0.0)
    return f"γ={chosen['exact']:g}" + (f" p≥{floor:g}" if floor else "")


def wall_clock(ntp_model, sbd_model, task, base, calibration, k, k_exact, n):
    """Seconds to decode the first n test problems one at a time: NTP, SBD at k's γ_low (k None:
    no γ_low on val), exact SBD at k_exact."""
    problems = task.splits["test"][:n]
    wall = {"ntp": seconds_at_batch_1(ntp_model, task, problems, base, ntp=True)}
    parts = [f"NTP {wall['ntp']:.2f} s"]
    if k is not None:
        g = calibration[k]["low"]
        wall["sbd"] = seconds_at_batch_1(sbd_model, task, problems, base.replace(k=k, gamma=g))
        parts.append(f"SBD k={k} γ={g:g} {wall['sbd']:.2f} s ({wall['ntp'] / wall['sbd']:.2f}x)")
    settings = exact_settings(base, k_exact, calibration[k_exact])
    wall["exact"] = seconds_at_batch_1(sbd_model, task, problems, settings)
    parts.append(f"exact SBD k={k_exact} {exact_name(calibration[k_exact])} "
                 f"{wall['exact']:.2f} s ({wall['ntp'] / wall['exact']:.2f}x)")
    print(f"\nwall clock, first {len(problems)} test problems one at a time (batch 1, KV cache "
          "all" + (", compiled once before timing" if base.compiled else "") + "): "
          + ", ".join(parts))
    return wall


def seconds_at_batch_1(model, task, problems, settings, ntp=False):
    """Seconds to decode problems one at a time. A compiled decoder decodes them once untimed
    first: the first forward of each width compiles it, which is not decoding time."""
    if settings.compiled:
        solve(model, task, problems, settings, ntp=ntp, batch_size=1)
    return solve(model, task, problems, settings, ntp=ntp, batch_size=1)["seconds"]


def step_views(sbd_model, task, base, calibration, k, k_exact):
    """One test problem step by step at k's γ_low (plain; k None: none), and a problem where the
    exact mode at k_exact rejected a draft."""
    device = next(sbd_model.parameters()).device
    views = [base.replace(k=k, gamma=calibration[k]["low"])] if k is not None else []
    views.append(exact_settings(base, k_exact, calibration[k_exact]))
    for settings in views:
        for prompt, _ in task.splits["test"][:50]:
            ids = torch.tensor([task.encode_prompt(prompt)], device=device)
            n = new_tokens(task, sbd_model, ids.size(1))
            _, stats = decode(sbd_model, ids, settings, n, record_steps=True)
            if not settings.exact or stats.rejected[0]:  # show where exact had something to correct
                break
        legend = (", ~x~ = rejected drafts, {y} = NTP's token in their place" if settings.exact
                  else "")
        print(f"\none test problem, {mode_name(settings)} k={settings.k} "
              f"γ={settings.gamma:g}, step by step "
              f"([x] = revealed by that forward, _ = masked{legend}):")
        print(format_steps(stats.steps, task.decode, task.mask_id, prompt=prompt))


def fp32_identity(ntp_model, sbd_model, task, base, calibration, n, batch_size, exact_batch_size):
    """The exact mode's promise where rounding cannot break ties differently: on the first n test
    problems, in fp32, exact SBD's completions must equal the SBD model's NTP decoding."""
    problems = task.splits["test"][:n]
    base = base.replace(compiled=False)  # a few problems: compiling fp32 graphs would cost more
    ntp = solve(sbd_model, task, problems, base, ntp=True, batch_size=batch_size)["completions"]
    result = {}
    for k, c in calibration.items():
        settings = exact_settings(base, k, c)
        out = solve(sbd_model, task, problems, settings, batch_size=exact_batch_size)["completions"]
        result[str(k)] = same = sum(a == b for a, b in zip(out, ntp))
        print(f"fp32 check, exact SBD k={k}: completions identical to NTP decoding on {same} of "
              f"{len(problems)} test problems")
    return dict(problems=len(problems), identical=result)
