#!/usr/bin/env python3
"""End-to-end test of `muon-offload orthogonalize` (and `schedules`) against NumPy.

Usage: scripts/venv-python test_orthogonalize_cli.py PATH/TO/muon-offload

The reference is the published formula (Keller Jordan, "Muon", 2024; modded-nanogpt
zeropower_via_newtonschulz5), in float64:
    X = G / ||G||_F                   (default scale_invariant; add: G / (||G||_F + eps),
                                       clamp: G / max(||G||_F, eps))
    transpose when rows > cols
    5 steps of  A = X X^T,  B = b A + c A A,  X = a X + B X   with (a, b, c) = (3.4445, -4.7750, 2.0315)
    U = max(1, rows / cols)^0.5 * X   (scale rule "keller")
Plain Python with asserts; needs NumPy (the project's venv, scripts/venv-python).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

KELLER = (3.4445, -4.7750, 2.0315)
TOL = 1e-4

BIN = None
TMP = None
RNG = np.random.default_rng(20240601)


def ns_reference(g, steps=5, eps=1e-7, eps_mode="scale_invariant"):
    """Newton-Schulz of one 2-D matrix in float64, no scale."""
    x = np.asarray(g, dtype=np.float64)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    norm = np.linalg.norm(x)
    x = {"scale_invariant": lambda: x / norm, "add": lambda: x / (norm + eps),
         "clamp": lambda: x / max(norm, eps)}[eps_mode]()
    a, b, c = KELLER
    for _ in range(steps):
        A = x @ x.T
        B = b * A + c * (A @ A)
        x = a * x + B @ x
    return x.T if tall else x


def keller_scale(rows, cols):
    return max(1.0, rows / cols) ** 0.5


def reference(g, **kw):
    """U for a 2-D or 3-D array with the keller scale."""
    if g.ndim == 3:
        return np.stack([reference(m, **kw) for m in g])
    return keller_scale(*g.shape) * ns_reference(g, **kw)


def rel_err(u, ref):
    return float(np.linalg.norm(np.asarray(u, np.float64) - ref) / np.linalg.norm(ref))


def path(name):
    return os.path.join(TMP, name)


def save(name, a):
    p = path(name)
    np.save(p, a)
    return p


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)


def orthogonalize(g, *flags, name="g"):
    """Runs the binary on g and returns U (checks exit 0, dtype, shape)."""
    src = save(name + ".npy", np.ascontiguousarray(g, dtype="<f4"))
    dst = path(name + "_u.npy")
    r = run("orthogonalize", "--input", src, "--output", dst, *flags)
    assert r.returncode == 0, f"exit {r.returncode}; stderr: {r.stderr}"
    u = np.load(dst)
    assert u.dtype == np.dtype("<f4"), u.dtype
    assert u.shape == g.shape, (u.shape, g.shape)
    return u


def expect_error(args, code, *needles):
    """Runs the binary, expects exit `code` (None: any non-zero) and one error line on stderr
    mentioning every needle (case-insensitive)."""
    r = run(*args)
    assert r.returncode != 0, f"{args}: exit 0, expected an error"
    if code is not None:
        assert r.returncode == code, f"{args}: exit {r.returncode}, expected {code}: {r.stderr}"
    assert r.stderr.startswith("muon-offload: error: "), f"{args}: stderr {r.stderr!r}"
    assert "Traceback" not in r.stderr and "terminate called" not in r.stderr, r.stderr
    for n in needles:
        assert n.lower() in r.stderr.lower(), f"{args}: {n!r} not in stderr {r.stderr!r}"
    return r


def gaussian(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ---- checks --------------------------------------------------------------------------------------

def check_matches_reference():
    for name, g in [("wide", gaussian(32, 80)), ("tall", gaussian(96, 48)),
                    ("batch", gaussian(3, 40, 24)), ("square", gaussian(40, 40))]:
        u = orthogonalize(g, name=name)
        err = rel_err(u, reference(g))
        assert err < TOL, f"{name}: relative error {err:.3g} >= {TOL}"
    # The other product forms compute the same polynomial.
    g = gaussian(24, 64)
    for algo, tol in [("syrk", TOL), ("gram", 5e-3)]:
        err = rel_err(orthogonalize(g, "--algorithm", algo, "--threads", "1", name=algo),
                      reference(g))
        assert err < tol, f"--algorithm {algo}: relative error {err:.3g} >= {tol}"
    # --steps changes the number of steps the reference runs.
    err = rel_err(orthogonalize(g, "--steps", "3", name="steps3"), reference(g, steps=3))
    assert err < TOL, f"--steps 3: relative error {err:.3g}"


def check_singular_value_band():
    # Input spectrum spread over 1 .. 1e-4 relative; directions holding >= 1e-2 of ||G||_F must
    # come out with singular values in Keller's band [0.68, 1.14].
    rows, cols = 48, 96
    p, _ = np.linalg.qr(RNG.standard_normal((rows, rows)))
    q, _ = np.linalg.qr(RNG.standard_normal((cols, rows)))
    s = np.geomspace(1.0, 1e-4, rows)
    g = ((p * s) @ q.T).astype(np.float32)
    u = orthogonalize(g, name="band").astype(np.float64)
    # Newton-Schulz keeps the singular vectors, so direction i of the output is p_i^T U q_i.
    g64 = g.astype(np.float64)
    pg, sg, qgt = np.linalg.svd(g64, full_matrices=False)
    out = np.einsum("ri,rc,ic->i", pg, u, qgt)
    keep = sg / np.linalg.norm(g64) >= 1e-2
    assert keep.sum() >= 10 and (~keep).sum() >= 5, keep.sum()
    lo, hi = out[keep].min(), out[keep].max()
    assert 0.68 <= lo and hi <= 1.14, f"singular values {lo:.4f} .. {hi:.4f} outside [0.68, 1.14]"
    # U really is P diag(out) Q^T: its SVD (np.linalg.svd) has exactly these singular values.
    # (Directions below 1e-2 may come out up to ~1.2: the band only covers s >= 1e-2.)
    su = np.linalg.svd(u, compute_uv=False)
    assert np.allclose(np.sort(su), np.sort(np.abs(out)), atol=1e-4), \
        np.abs(np.sort(su) - np.sort(np.abs(out))).max()


def check_split():
    # 64 x 24 in blocks 16 (wide), 16 (wide), 32 (tall: transposed, scale sqrt(32/24)).
    g = gaussian(64, 24)
    u = orthogonalize(g, "--split", "16,16,32", name="split")
    blocks = []
    row = 0
    for i, rb in enumerate((16, 16, 32)):
        blocks.append(orthogonalize(g[row:row + rb], name=f"block{i}"))
        row += rb
    joined = np.concatenate(blocks)
    assert np.array_equal(u, joined), \
        f"--split differs from per-block runs: max diff {np.abs(u - joined).max():.3g}"
    ref = np.concatenate([reference(g[0:16]), reference(g[16:32]), reference(g[32:64])])
    err = rel_err(u, ref)
    assert err < TOL, f"--split: relative error {err:.3g}"
    # Without the split the result is a different matrix.
    assert rel_err(orthogonalize(g, name="nosplit"), ref) > 1e-2


def check_scale():
    g = gaussian(80, 20)
    plain = orthogonalize(g, "--scale", "none", name="scale_none").astype(np.float64)
    err = rel_err(plain, ns_reference(g))
    assert err < TOL, f"--scale none: relative error {err:.3g}"
    for rule, factor in [("keller", 2.0), ("match_adamw", 0.2 * 80 ** 0.5),
                         ("sqrt_max", 80 ** 0.5), ("unit_rms", 2.0), ("none", 1.0)]:
        for extra in (1.0, 0.5, 3.0):
            u = orthogonalize(g, "--scale", rule, "--extra-scale", str(extra), name="scale")
            err = rel_err(u, plain * factor * extra)
            assert err < 1e-6, f"--scale {rule} --extra-scale {extra}: relative error {err:.3g}"


def check_eps_mode():
    # ||G||_F = 5e-8 < eps = 1e-7: add gives ||X|| = 1/3, clamp gives 0.5; the results differ.
    g = gaussian(24, 40)
    g = (g / np.linalg.norm(g.astype(np.float64)) * 5e-8).astype(np.float32)
    clamp = orthogonalize(g, "--eps-mode", "clamp", name="clamp")
    add = orthogonalize(g, "--eps-mode", "add", name="add")
    ref_clamp = reference(g, eps_mode="clamp")
    ref_add = reference(g, eps_mode="add")
    assert rel_err(clamp, ref_clamp) < TOL, rel_err(clamp, ref_clamp)
    assert rel_err(add, ref_add) < TOL, rel_err(add, ref_add)
    assert rel_err(ref_clamp, ref_add) > 1e-2  # the check above can tell the two modes apart
    # The default is scale invariant: the tiny gradient gives what the same gradient scaled to
    # norm 1 gives (eps does not shrink it), where add and clamp give much less.
    tiny = orthogonalize(g, name="tiny")
    unit = orthogonalize((g.astype(np.float64) / 5e-8).astype(np.float32), name="unit")
    assert rel_err(tiny, unit) < 1e-6, rel_err(tiny, unit)
    assert rel_err(tiny, reference(g)) < TOL
    assert rel_err(add, reference(g)) > 1e-2
    # --eps moves the guard: with eps 1e-9 both modes are ~ G / ||G||_F.
    near = orthogonalize(g, "--eps-mode", "clamp", "--eps", "1e-9", name="clamp_eps")
    assert rel_err(near, reference(g, eps=1e-9, eps_mode="clamp")) < TOL


def check_errors():
    ok = save("ok.npy", gaussian(8, 16))
    out = path("err_u.npy")
    missing = path("does_not_exist.npy")
    expect_error(["orthogonalize", "--input", missing, "--output", out], 2,
                 "does_not_exist.npy", "no such file")
    vec = save("vec.npy", gaussian(16))
    expect_error(["orthogonalize", "--input", vec, "--output", out], 2, "vec.npy", "1-D")
    t4 = save("t4.npy", gaussian(2, 2, 2, 2))
    expect_error(["orthogonalize", "--input", t4, "--output", out], 2, "4-D")
    f8 = save("f8.npy", RNG.standard_normal((4, 4)))
    expect_error(["orthogonalize", "--input", f8, "--output", out], 2, "<f8", "<f4")
    be = save("be.npy", gaussian(4, 4).astype(">f4"))
    expect_error(["orthogonalize", "--input", be, "--output", out], 2, ">f4")
    fortran = save("fortran.npy", np.asfortranarray(gaussian(4, 6)))
    expect_error(["orthogonalize", "--input", fortran, "--output", out], 2, "fortran_order")
    with open(path("trunc.npy"), "wb") as f:
        f.write(open(ok, "rb").read()[:-8])
    expect_error(["orthogonalize", "--input", path("trunc.npy"), "--output", out], 2, "truncated")
    with open(path("notnpy.npy"), "wb") as f:
        f.write(b"hello, this is not an npy file at all")
    expect_error(["orthogonalize", "--input", path("notnpy.npy"), "--output", out], 2, "magic")
    nan = gaussian(8, 16)
    nan[3, 4] = np.nan
    expect_error(["orthogonalize", "--input", save("nan.npy", nan), "--output", out], 2, "NaN")
    expect_error(["orthogonalize", "--input", ok, "--output", out, "--schedule", "nope"], 2,
                 "nope", "keller")
    expect_error(["orthogonalize", "--input", ok, "--output", out, "--split", "3,3"], 2,
                 "add up to 6", "8 rows")
    expect_error(["orthogonalize", "--input", ok, "--output", out, "--scale", "spectral"], 2,
                 "spectral")
    expect_error(["orthogonalize", "--input", ok, "--output", out, "--eps-mode", "mul"], 2, "mul")
    expect_error(["orthogonalize", "--input", ok, "--output", out, "--steps", "abc"], 2, "steps")
    expect_error(["orthogonalize", "--input", ok], 2, "--output")
    expect_error(["orthogonalize", "--input", ok, "--output", out, "--backend", "tpu"], 2, "tpu")
    expect_error(["orthogonalize", "--input", ok, "--output", os.path.join(TMP, "no", "dir.npy")],
                 None, "cannot open for writing")
    expect_error([], 2, "subcommand")
    expect_error(["frobnicate"], 2)
    assert not os.path.exists(out), "an error run wrote its output"

    # --backend cuda: on a machine without a usable GPU (or a build without CUDA) the run fails
    # with a message about CUDA; where CUDA works, the result must match the reference.
    r = run("orthogonalize", "--input", ok, "--output", out, "--backend", "cuda")
    if r.returncode != 0:
        assert r.returncode == 1, f"--backend cuda: exit {r.returncode}: {r.stderr}"
        assert r.stderr.startswith("muon-offload: error: "), r.stderr
        assert "cuda" in r.stderr.lower() and "unavailable" in r.stderr.lower(), r.stderr
    else:
        g = np.load(ok)
        err = rel_err(np.load(out), reference(g))
        assert err < 3e-2, f"--backend cuda: relative error {err:.3g}"
        print("note: CUDA backend available; checked its result instead of the refusal")


def check_schedules_and_version():
    r = run("schedules")
    assert r.returncode == 0, r.stderr
    for name in ("keller", "simple", "polar_express", "deepseek_v4", "cycle", "repeat_last",
                 "hybrid_tail", "Keller Jordan"):
        assert name in r.stdout, f"`schedules` does not mention {name!r}:\n{r.stdout}"
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("muon-offload "), (r.returncode, r.stdout)
    r = run("orthogonalize", "--help")
    assert r.returncode == 0 and "--split" in r.stdout, (r.returncode, r.stdout)


def check_auto_choice_is_listed():
    """The default algorithm (auto) measures plain, syrk and gram on a new block shape once,
    writes the choice to its table, and `schedules` lists it with the reason; a second run reads
    the choice and gives the same bits."""
    table = path("ns-choices.json")
    before = os.environ.get("MUON_OFFLOAD_NS_TABLE")
    os.environ["MUON_OFFLOAD_NS_TABLE"] = table
    try:
        g = RNG.standard_normal((36, 52)).astype(np.float32)
        u1 = orthogonalize(g, "--threads", "1", name="auto1")
        assert os.path.exists(table), "auto did not write its choice table"
        u2 = orthogonalize(g, "--threads", "1", name="auto2")
        assert np.array_equal(u1, u2), "a second process chose differently"
        assert rel_err(u1, reference(g)) < TOL
        r = run("schedules")
        assert r.returncode == 0, r.stderr
        assert table in r.stdout and "fp32 36x52 steps=5 restart=2" in r.stdout, r.stdout
        assert "fastest within 3 %" in r.stdout, r.stdout
    finally:
        if before is None:
            del os.environ["MUON_OFFLOAD_NS_TABLE"]
        else:
            os.environ["MUON_OFFLOAD_NS_TABLE"] = before


def main():
    global BIN, TMP
    if len(sys.argv) != 2:
        sys.exit("usage: test_orthogonalize_cli.py PATH/TO/muon-offload")
    BIN = os.path.abspath(sys.argv[1])
    checks = [check_matches_reference, check_singular_value_band, check_split, check_scale,
              check_eps_mode, check_errors, check_schedules_and_version,
              check_auto_choice_is_listed]
    with tempfile.TemporaryDirectory(prefix="muon_cli_test_") as tmp:
        TMP = tmp
        for check in checks:
            check()
            print(f"ok  {check.__name__}")


if __name__ == "__main__":
    main()
