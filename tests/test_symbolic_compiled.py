"""The compiled evaluator (``symbolic/compiled.py``) is ``features.evaluate``: same values and
same gradients, on every sketch of several operators, for batches whose points share a case
and batches whose points do not, and on leaves that are 0, negative or NaN."""

from pathlib import Path

import numpy as np
import pytest
import torch

OPS = Path(__file__).parent / "ops"
# Matmul-like, a convolution, a multi-store operator (9 sketches), a pooling.
TASKS = ["dense_bias_relu", "conv2d_nchw_s2", "layer_norm", "max_pool2d"]


@pytest.fixture(scope="module", params=TASKS)
def sketches(request):
    from gradtune.symbolic.sketch import SymbolicSketch
    from gradtune.symbolic.verify import design_space, load_tvmscript
    from gradtune.target import make_target, parse_target

    target = make_target(parse_target("llvm"))
    mod = load_tvmscript(OPS / f"{request.param}.tvmscript")
    _, found, postprocs = design_space(mod, target)
    rng = np.random.default_rng(0)
    return [SymbolicSketch.build(mod, s.trace, postprocs, rng=rng) for s in found]


def reference(sym, x: torch.Tensor, mode: str, refit: bool) -> list:
    """``sym.features`` as it was before compiled.py: leaves + ``evaluate`` per case."""
    from gradtune.symbolic.features import evaluate

    log_f, cats = sym.continuous_columns(x)
    groups: dict[int, tuple] = {}
    for i, row in enumerate(x.detach().numpy()):
        probe = sym.replay(sym.variables.round(row))
        if probe is not None:
            if refit:
                sym.fit_case(probe)
            groups.setdefault(id(probe.program), (probe, []))[1].append(i)
    out = [None] * x.shape[0]
    for probe, idx in groups.values():
        sel = torch.tensor(idx)
        leaves = sym.leaves(probe.program, log_f[sel], cats[sel], point_values=not refit, mode=mode)
        values = evaluate(probe.program, leaves, mode)
        for j, i in enumerate(idx):
            out[i] = values[j]
    return out


def mixed_points(sym, rng: np.random.Generator, spread: int = 5) -> np.ndarray:
    """Three points sharing one case, then ``spread`` random ones (most in cases of their
    own)."""
    centre = sym.variables.encode(sym.random_decisions(rng))
    shared = centre + rng.uniform(-0.2, 0.2, (3, sym.variables.dim))
    others = [sym.variables.random_point(rng) for _ in range(spread)]
    return np.concatenate([shared, *[o[None] for o in others]])


def compare(sym, points: np.ndarray, mode: str, refit: bool = False, nan_grads=False) -> list:
    """Features and gradients (of a random weighting of the features) of both paths agree;
    returns the features. ``nan_grads``: gradients compared where both are finite (see the
    zero-extent case below)."""
    weights = torch.rand(164, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    results = []
    for path in ("compiled", "reference"):
        x = torch.tensor(points, requires_grad=True)
        if path == "compiled":
            feats = sym.features(x, mode, refit)
        else:
            feats = reference(sym, x, mode, refit)
        present = [f for f in feats if f is not None]
        if present:
            sum((f * weights).nansum() for f in present).backward()
        results.append((feats, x.grad))
    (got, got_grad), (ref, ref_grad) = results
    for g, r in zip(got, ref, strict=True):
        assert (g is None) == (r is None)
        if r is not None:
            assert g.shape == r.shape
            np.testing.assert_allclose(g.detach().numpy(), r.detach().numpy(), rtol=0, atol=1e-9)
    if got_grad is not None or ref_grad is not None:
        got_g, ref_g = got_grad.numpy(), ref_grad.numpy()
        if nan_grads:
            both = np.isfinite(got_g) & np.isfinite(ref_g)
            got_g, ref_g = got_g[both], ref_g[both]
        np.testing.assert_allclose(got_g, ref_g, rtol=1e-6, atol=1e-8)
    return got


def test_compiled_equals_evaluate_on_every_sketch(sketches):
    from gradtune.symbolic.compiled import compiled

    rng = np.random.default_rng(3)
    for sym in sketches:
        points = rng.permutation(mixed_points(sym, rng))  # the shared case's points apart
        for mode in ("exact", "smooth"):
            assert sum(f is not None for f in compare(sym, points, mode)) >= 4
        # The batch really mixed cases, and some of its points shared one.
        probes = [sym.replay(sym.variables.round(p)) for p in points]
        cases = [compiled(p.program, sym._bank(p.program, True)) for p in probes if p]
        assert 1 < len({id(c) for c in cases}) < len(cases)


# Refitting replays whole neighbourhoods: one operator is enough.
@pytest.mark.parametrize("sketches", ["dense_bias_relu"], indirect=True)
def test_compiled_equals_evaluate_with_refit_and_at_decisions(sketches):
    """The verify path: case formulas refitted (leaves without one are NaN and poison their
    features in both) and ``features_at`` at integer decisions."""
    from gradtune.symbolic.features import evaluate

    sym = sketches[0]
    rng = np.random.default_rng(4)
    points = mixed_points(sym, rng, spread=2)
    for mode in ("exact", "smooth"):
        compare(sym, points, mode, refit=True)
    for _ in range(3):
        decisions = sym.random_decisions(rng)
        probe = sym.replay(decisions)
        if probe is None:
            continue
        log_f, cats = sym.columns(probe.decisions)
        for mode in ("exact", "smooth"):
            log_t, cat_t = torch.tensor(log_f)[None], torch.tensor(cats)[None]
            leaves = sym.leaves(probe.program, log_t, cat_t, mode=mode)
            got = sym.features_at(decisions, mode).numpy()
            ref = evaluate(probe.program, leaves, mode)[0].numpy()
            np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9)


@pytest.mark.parametrize(
    "leaf, value",
    [("extent", 0.0), ("region", 0.0), ("region", -3.0), ("extent", np.nan), ("stride", np.nan)],
)
def test_degenerate_leaves_match_evaluate(sketches, monkeypatch, leaf, value):
    """A loop extent, a touched-region dimension or a stride forced to ``value`` in one case:
    products with a 0 are 0, a negative region clamps at 0, a NaN poisons exactly what it
    poisons in ``evaluate`` (a NaN stride makes its slots unsortable), gradients agree."""
    sym = sketches[-1]
    rng = np.random.default_rng(5)
    points = mixed_points(sym, rng, spread=1)
    program = sym.replay(sym.variables.round(points[0])).program
    store = next(s for s in program.stores if s.loops and any(a.numel_keys[0] for a in s.accesses))
    access = next(a for a in store.accesses if a.numel_keys[0])
    key = {
        "extent": store.loops[-1].key,
        "region": access.numel_keys[0][0],
        "stride": access.stride_keys[0],
    }[leaf]
    before = sym.features(torch.tensor(points[:1]), "exact", refit=False)[0]
    original = sym._bank
    patched: dict[int, dict] = {}

    def bank(program_, point_values):
        bank = original(program_, point_values)
        if program_.signature() != program.signature():
            return bank
        if id(bank) not in patched:
            patched[id(bank)] = _with_constant(bank, key, value)
        return patched[id(bank)]

    monkeypatch.setattr(sym, "_bank", bank)
    # A zero loop extent empties the regions derived from it (regions.py): the arithmetic-
    # intensity curve is then 0 / 0, and which gradients that NaN reaches through the leaves
    # the regions are built from depends on each path's backward.
    nan_grads = leaf == "extent" and value == 0.0
    for mode in ("exact", "smooth"):
        after = compare(sym, points, mode, nan_grads=nan_grads)[0]
        if mode == "exact":
            changed = ~torch.isclose(after, before, equal_nan=True)
            # (A 0 extent may give NaN too, as in evaluate: 0 / 0 lines.)
            assert changed.any() and (after.isnan().any() or not np.isnan(value))


def _with_constant(bank: dict, key: str, value: float) -> dict:
    """``bank`` with leaf ``key`` a constant ``value`` (a copy; its compiled case is not)."""
    i = bank["keys"].index(key)
    out = {k: v for k, v in bank.items() if k != "compiled"}
    out["const"] = bank["const"].clone()
    out["const"][0, i] = value
    mono = bank["mono_idx"] != i
    for name in ("mono_idx", "exps", "log_coef", "offset"):
        out[name] = bank[name][mono]
    cat = bank["cat_idx"] != i
    for name in ("cat_idx", "cat_col"):
        out[name] = bank[name][cat]
    out["derived"] = [entry for entry in bank["derived"] if entry[0] != key]
    return out
