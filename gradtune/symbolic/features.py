"""TVM's 164 per-store features as a torch function of a program's leaves.

``evaluate(program, leaves, mode)`` follows ``per_store_feature.cc`` group by group (computation
57, buffer access 5 × 18, arithmetic-intensity curve 10, allocation 4, outer loops 3), all in
float64 and batched over points that share the program's case. ``mode="exact"`` uses hard
min/max and is what is checked against TVM; ``mode="smooth"`` replaces the clamps and the
minimum with Felix's smooth versions so gradients pass through every branch. What stays
piecewise in both modes is stated where it happens: the sort of buffer slots and the segment
of the arithmetic-intensity curve (their choice has no gradient, the values they pick do).
"""

from __future__ import annotations

import math

import torch

from gradtune.symbolic.program import ARITH_NAMES, CACHE_LINE_BYTES, Program

FEATURES = 164
BUFFERS_PER_STORE = 5
CURVE_SAMPLES = 10

# Feature groups as (name, start, stop), for reports and per-group tolerances.
GROUPS = (
    ("arith_ops", 0, 16),
    ("vectorize_unroll_parallel", 16, 49),
    ("gpu_threads", 49, 57),
    ("buffer_access", 57, 147),
    ("arith_intensity", 147, 157),
    ("allocation", 157, 161),
    ("outer_loops", 161, 164),
)

_LN2 = math.log(2.0)


def _feature_names() -> list[str]:
    names = list(ARITH_NAMES)
    positions = ["none", "inner_spatial", "middle_spatial", "outer_spatial"]
    positions += ["inner_reduce", "middle_reduce", "outer_reduce", "mixed"]
    for kind in ("vectorize", "unroll", "parallel"):
        names += [f"{kind}_num", f"{kind}_prod", f"{kind}_len"]
        names += [f"{kind}_pos_{p}" for p in positions]
    names += ["is_gpu", "blockIdx_x_len", "blockIdx_y_len", "blockIdx_z_len"]
    names += ["threadIdx_x_len", "threadIdx_y_len", "threadIdx_z_len", "vthread_len"]
    access = ["read", "write", "read_write", "bytes", "unique_bytes", "lines", "unique_lines"]
    access += ["reuse_loop", "reuse_serial", "reuse_none", "reuse_dis_iter", "reuse_dis_bytes"]
    access += ["reuse_ct", "bytes_d_reuse_ct", "unique_bytes_d_reuse_ct", "lines_d_reuse_ct"]
    access += ["unique_lines_d_reuse_ct", "stride"]
    for slot in range(BUFFERS_PER_STORE):
        names += [f"buf{slot}_{a}" for a in access]
    names += [f"arith_intensity_{i}" for i in range(CURVE_SAMPLES)]
    names += ["alloc_size", "alloc_prod", "alloc_outer_prod", "alloc_inner_prod"]
    names += ["outer_prod", "num_loops", "auto_unroll_max_step"]
    return names


FEATURE_NAMES = _feature_names()
assert len(FEATURE_NAMES) == FEATURES


def slog(x: torch.Tensor) -> torch.Tensor:
    """log2(1 + |x|), the transform TVM applies to every numeric feature."""
    return torch.log1p(x.abs()) / _LN2


def smooth_max(a: torch.Tensor, b: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "exact":
        return torch.maximum(a, b)
    # Felix-style: a hyperbola through max(a, b) whose corner is rounded over a width relative
    # to the operands, so it stays scale-free across the many orders of magnitude features span.
    width = 0.05 * (a.abs() + b.abs()) + 1e-9
    return 0.5 * (a + b + torch.sqrt((a - b) ** 2 + width**2))


def smooth_min(a: torch.Tensor, b: torch.Tensor, mode: str) -> torch.Tensor:
    return -smooth_max(-a, -b, mode)


def _prod(tensors: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    out = torch.ones_like(like)
    for t in tensors:
        out = out * t
    return out


def evaluate(
    program: Program, leaves: dict[str, torch.Tensor], mode: str = "exact"
) -> torch.Tensor:
    """Features of every store: a (batch, stores, 164) float64 tensor."""
    if mode not in ("exact", "smooth"):
        raise ValueError(f"mode must be 'exact' or 'smooth', not {mode!r}")
    some = next(iter(leaves.values()))
    zero = torch.zeros_like(some, dtype=torch.float64)
    one = zero + 1.0

    def leaf(key: str) -> torch.Tensor:
        return leaves[key]

    # The same touched regions recur across slots and reuse distances: build each product once
    # (every op here becomes an autograd node, and backward time follows their count).
    cache: dict[tuple[str, ...], torch.Tensor] = {}

    def elems(dims: tuple[str, ...]) -> torch.Tensor:
        if dims not in cache:
            cache[dims] = _prod([leaf(k) for k in dims], one).clamp(min=0)
        return cache[dims]

    rows = []
    for store in program.stores:
        extents = [leaf(lp.key) for lp in store.loops]
        prod = _prod(extents, one)
        n = len(store.loops)
        feats: list[torch.Tensor] = []

        # Group 1: op counts × loop product; for-kind features; GPU thread lengths.
        for count in store.arith:
            feats.append(slog(prod * count) if count else zero)
        for kind in ("vectorized", "unrolled", "parallel"):
            idx = [i for i, lp in enumerate(store.loops) if lp.kind == kind]
            if not idx:
                feats += [zero, zero, zero, one] + [zero] * 7
            else:
                kprod = _prod([extents[i] for i in idx], one)
                # The C++ never assigns a position other than "mixed" (7) when loops exist.
                feats += [slog(one * len(idx)), slog(kprod), slog(extents[idx[-1]])]
                feats += [zero] * 7 + [one]
        if program.is_gpu:
            feats.append(one)
            for tag in ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y"):
                first = [i for i, lp in enumerate(store.loops) if lp.tag == tag]
                feats.append(slog(extents[first[0]]) if first else slog(one))
            for tag in ("threadIdx.z", "vthread"):
                first = [i for i, lp in enumerate(store.loops) if lp.tag == tag]
                feats.append(slog(extents[first[0]]) if first else slog(one))
        else:
            feats += [zero] + [slog(one)] * 7

        # Group 2: per buffer access, then slots sorted by lines, bytes (descending), name.
        slots = []
        for acc in store.accesses:
            nbytes = float(acc.dtype_bytes)
            bytes_ = prod * nbytes
            stride_elems = _prod([leaf(k) for k in acc.stride_keys], one)
            if n == 0:
                unique_bytes = lines = unique_lines = one
            else:
                unique_bytes = elems(acc.numel_keys[0]) * nbytes
                inner = _prod([extents[j] for j in range(acc.stride_level + 1, n)], one)
                ratio = stride_elems * nbytes / CACHE_LINE_BYTES
                lines = prod / inner * smooth_min(one, ratio, mode)
                lines = smooth_max(one, lines, mode)
                if acc.continuous_dim_key:
                    continuous = leaf(acc.continuous_dim_key) * nbytes
                else:
                    continuous = one
                unique_lines = unique_bytes / smooth_min(one * CACHE_LINE_BYTES, continuous, mode)
                unique_lines = smooth_max(one, unique_lines, mode)
            if acc.reuse_type == 0:
                i = acc.reuse_level
                reuse_ct = extents[i]
                dis_iter = _prod([extents[j] for j in range(i + 1, n)], one)
                if acc.distance_terms:
                    dis_bytes = sum(elems(k) * b for k, b in acc.distance_terms)
                else:
                    dis_bytes = one * acc.distance_const
            elif acc.reuse_type == 1:
                i = acc.reuse_level
                reuse_ct = one * (len(acc.serial_touched) - 1)
                touched = [elems(k) for k in acc.serial_touched]
                low = touched[0]
                for t in touched[1:]:
                    low = smooth_min(low, t, mode)
                dis_bytes = sum(elems(k) * b for k, b in acc.distance_terms)
                dis_iter = low / extents[i]
                dis_bytes = dis_bytes / extents[i]
            else:
                reuse_ct, dis_iter, dis_bytes = zero, zero, zero
            proxy = reuse_ct if acc.reuse_type != 2 else one * 0.5
            stride = stride_elems if acc.stride_level == n - 1 and n > 0 else zero
            vector = [
                one * (acc.access_type == 0),
                one * (acc.access_type == 1),
                one * (acc.access_type == 2),
                slog(bytes_),
                slog(unique_bytes),
                slog(lines),
                slog(unique_lines),
                one * (acc.reuse_type == 0),
                one * (acc.reuse_type == 1),
                one * (acc.reuse_type == 2),
                slog(dis_iter),
                slog(dis_bytes),
                slog(reuse_ct),
                slog(bytes_ / proxy),
                slog(unique_bytes / proxy),
                slog(lines / proxy),
                slog(unique_lines / proxy),
                slog(stride),
            ]
            slots.append((acc.buffer, lines, bytes_, torch.stack(vector, -1)))
        feats_g2 = _sorted_slots(slots, zero)

        # Group 3: arithmetic intensity (FLOPs / bytes touched) sampled along the loop nest.
        float_ops = sum(store.arith[:7])
        touched_bytes = [
            sum(elems(a.numel_keys[i]) * a.dtype_bytes for a in store.accesses) for i in range(n)
        ]
        curve = _intensity_curve(float_ops, extents, touched_bytes, zero)

        # Group 4: the stored buffer's allocation; group 5: the loop nest.
        if store.alloc_shape_keys is not None:
            numel = _prod([leaf(k) for k in store.alloc_shape_keys], one)
            alloc_outer = _prod([leaf(k) for k in store.alloc_loop_keys], one)
            alloc = [numel * store.alloc_dtype_bytes, numel * alloc_outer, alloc_outer]
        else:
            alloc = [zero, zero, one]
        g4 = [slog(a) for a in alloc] + [slog(prod / alloc[2])]
        unroll = [lp.unroll_key for lp in store.loops if lp.unroll_key]
        g5 = [slog(prod), slog(one * n), slog(leaf(unroll[-1])) if unroll else zero]

        rows.append(
            torch.cat([torch.stack(feats, -1), feats_g2, curve, torch.stack(g4 + g5, -1)], -1)
        )
    if not rows:
        return torch.zeros((some.shape[0], 0, FEATURES), dtype=torch.float64)
    return torch.stack(rows, 1)


def _sorted_slots(slots: list, zero: torch.Tensor) -> torch.Tensor:
    """The C++ sorts buffer slots by lines, then bytes (both descending), then name. The
    order is piecewise constant in the decisions: chosen per point, no gradient through it."""
    batch = zero.shape[0]
    width = 18 * BUFFERS_PER_STORE
    out = torch.zeros((batch, width), dtype=torch.float64)
    if not slots:
        return out
    vectors = torch.stack([s[3] for s in slots], 1)  # (batch, slots, 18)
    lines = torch.stack([s[1] for s in slots], 1).detach()
    bytes_ = torch.stack([s[2] for s in slots], 1).detach()
    names = [s[0] for s in slots]
    rows = []
    for b in range(batch):
        # Compare at 9 significant digits: formulas give 255.99999999997 where TVM has 256,
        # and a tie broken by rounding noise would swap whole slots.
        def key(i: int, b: int = b) -> tuple:
            return (-float(f"{lines[b, i]:.9g}"), -float(f"{bytes_[b, i]:.9g}"), names[i])

        order = sorted(range(len(slots)), key=key)[:BUFFERS_PER_STORE]
        row = vectors[b, order].reshape(-1)
        pad = width - row.shape[0]
        rows.append(torch.cat([row, torch.zeros(pad, dtype=torch.float64)]) if pad else row)
    return torch.stack(rows, 0)


def _intensity_curve(
    float_ops: int, extents: list[torch.Tensor], touched: list[torch.Tensor], zero: torch.Tensor
) -> torch.Tensor:
    n = len(extents)
    if float_ops <= 0 or n == 0:
        return torch.zeros((zero.shape[0], CURVE_SAMPLES), dtype=torch.float64)
    compute, ops = [], zero + float(float_ops)
    for i in range(n - 1, -1, -1):
        ops = ops * extents[i]
        compute.append(ops)
    memory = [touched[n - 1 - k] for k in range(n)]
    compute_t = torch.stack(compute, 0)  # (levels, batch), innermost first
    memory_t = torch.stack(memory, 0)
    total = compute_t[-1]
    fractions = torch.arange(1, CURVE_SAMPLES + 1, dtype=torch.float64) / CURVE_SAMPLES
    cur = fractions[:, None] * total[None]  # (samples, batch)
    # The first level whose compute reaches each sample: a segment choice, no gradient.
    reached = compute_t.detach()[None] >= (cur.detach()[:, None] - 1e-4)  # (samples, levels, b)
    p = torch.argmax(reached.to(torch.int64), 1)  # (samples, batch)
    return slog(curve_at(compute_t, memory_t, cur, p, 0)).T


def curve_at(
    compute: torch.Tensor, memory: torch.Tensor, cur: torch.Tensor, p: torch.Tensor, dim: int
) -> torch.Tensor:
    """FLOPs per byte at ``cur`` FLOPs, interpolated on the segment of loop levels ending at
    ``p`` (indices along ``dim``): what the C++ samples the arithmetic-intensity curve with."""
    q = (p - 1).clamp(min=0)
    c_p, m_p = compute.gather(dim, p), memory.gather(dim, p)
    c_q, m_q = compute.gather(dim, q), memory.gather(dim, q)
    base = c_q / m_q
    denom = torch.where(p == 0, torch.ones_like(c_p), c_p - c_q)
    slope = (c_p / m_p - base) / denom
    return torch.where(p == 0, c_p / m_p, base + slope * (cur - c_q))
