"""
The γ sweep as a picture (sweep.png): val accuracy against tokens per forward, one curve per block
size, from the smallest γ to revealing every masked position at once, the exact mode as a star.
"""

from report.summary import pyplot
from sampling import ONE_FORWARD
from tasks.solve import solve, tokens_per_forward

TAIL = (0.1, 1.0, ONE_FORWARD)  # past the choice, up to revealing everything at once
CURVE_GRID = (1e-3, 0.01, 0.1, 1.0, ONE_FORWARD)  # a block size that is only drawn


def curves(model, task, base, calibration, extra_ks, n, batch_size, exact_batch_size):
    """{k: dict(points=[(γ, val accuracy, tokens per forward)], exact=tokens per forward, low,
    high)} for the picture: each calibrated k's sweep continued past where the choice stopped (on
    the first n val problems), and the extra block sizes swept coarsely on the same problems."""
    val = task.splits["val"][:n]

    def point(k, g):
        r = solve(model, task, val, base.replace(k=k, gamma=g), batch_size=batch_size)
        print(f"  picture   k={k:2d} γ={g:<7g} val accuracy {r['accuracy']:6.2f}%  "
              f"{tokens_per_forward(r):5.2f} tokens/forward ({len(val)} val problems)")
        return g, r["accuracy"], tokens_per_forward(r)

    out = {}
    for k, c in calibration.items():
        tail = [point(k, g) for g in TAIL if g > c["sweep"][-1][0]]
        out[k] = dict(points=c["sweep"] + tail, exact=max(s[-1] for s in c["exact_sweep"]),
                      low=c["low"], high=c["high"])
    for k in extra_ks:
        exact = solve(model, task, val, base.replace(k=k, gamma=ONE_FORWARD, exact=True),
                      batch_size=exact_batch_size)
        out[k] = dict(points=[point(k, g) for g in CURVE_GRID], exact=tokens_per_forward(exact),
                      low=None, high=None)
    return out


def plot_sweep(curves, ntp_val_accuracy, low_target, path, trained_k=None):
    """Val accuracy against tokens per forward, one curve per k from the smallest γ to revealing
    every masked position at once; γ_low/γ_high and the exact mode (a star at NTP's accuracy)
    marked. matplotlib is optional: without it, say how to get the picture and go on."""
    plt = pyplot("this sweep as a picture")
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for k, c in curves.items():
        gammas, accs, tpfs = zip(*c["points"])
        lossless = min(accs) >= ntp_val_accuracy - low_target
        label = f"SBD k={k}" + (" (no γ loses accuracy)" if lossless else "")
        if trained_k is not None and k > trained_k:
            label += f", a block size never trained (k <= {trained_k})"
        line, = ax.plot(tpfs, accs, "o-", label=label)
        ax.annotate("all at once", (tpfs[-1], accs[-1]), textcoords="offset points",
                    xytext=(4, 4), fontsize=7, color=line.get_color())
        for name, marker in (("low", "v"), ("high", "^")):
            g = c[name]
            if g is not None:
                i = gammas.index(g)
                ax.plot(tpfs[i], accs[i], marker, color=line.get_color(), markersize=12,
                        markerfacecolor="none")
                both = c["low"] == c["high"]  # one γ that is both gets one label
                if name == "high" or not both:
                    text = "γ_low=γ_high" if both else f"γ_{name}"
                    ax.annotate(f"{text}={g:g}", (tpfs[i], accs[i]), textcoords="offset points",
                                xytext=(6, -12), fontsize=8)
        ax.plot(c["exact"], ntp_val_accuracy, "*", color=line.get_color(), markersize=14,
                label=f"exact SBD k={k}")
    ax.axhline(ntp_val_accuracy, color="gray", linestyle="--", label="NTP (1 token/forward)")
    # at least 2 points of scale below NTP: on a nearly perfect model one val problem (0.05 points)
    # would otherwise fill the whole height and look like a cliff
    accuracies = [a for c in curves.values() for _, a, _ in c["points"]] + [ntp_val_accuracy]
    ax.set_ylim(min(min(accuracies), ntp_val_accuracy - 2) - 0.5, max(accuracies) + 0.5)
    ax.set_xlabel("tokens per forward (= NFE speed-up over NTP)")
    ax.set_ylabel("val accuracy (%)")
    ax.set_title("SBD: accuracy against forwards saved, one point per γ")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
