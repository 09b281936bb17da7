"""The Gaussian sampler: its definition checked with Python integers, the compiled kernel against
the torch implementation, the distribution, determinism and the fallbacks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from fedsim.training import gaussian, native
from fedsim.training.gaussian import gaussian_noise, mix_gamma, reference_pairs

MASK = (1 << 64) - 1


def splitmix_output(state: int) -> int:
    """mix64 of a SplitMix64 state, written out in Python integers (Steele et al. 2014)."""
    z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def expected_pairs(pairs: int, seed: int, gamma: int, std: float) -> np.ndarray:
    """The sampler's definition in float64 from Python-integer SplitMix64 outputs."""
    out = np.empty(2 * pairs)
    for i in range(pairs):
        z = splitmix_output((seed + (i + 1) * gamma) & MASK)
        u1 = ((z >> 40) + 1) / 2**24
        if z >> 40 == 0:  # the tail: refined by the low 16 bits and output pairs + i
            extra = splitmix_output((seed + (pairs + i + 1) * gamma) & MASK)
            u1 = ((z & 0xFFFF) * 2**64 + extra + 1) / 2**104
        u2 = ((z >> 16) & 0xFFFFFF) / 2**24
        radius = std * math.sqrt(-2 * math.log(u1))
        out[i], out[pairs + i] = radius * math.cos(2 * math.pi * u2), radius * math.sin(2 * math.pi * u2)
    return out


def test_splitmix_matches_the_reference_implementations_first_outputs() -> None:
    # splitmix64.c (Vigna) seeded with 0: the golden gamma 0x9E3779B97F4A7C15 is the increment.
    gamma = 0x9E3779B97F4A7C15
    assert [splitmix_output(i * gamma & MASK) for i in (1, 2)] == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
    ]


def test_mix_gamma_is_odd_with_enough_bit_transitions() -> None:
    for value in [0, 1, 2**63, MASK, 0x0123456789ABCDEF, *range(2, 200)]:
        gamma = mix_gamma(value)
        assert gamma & 1 == 1 and 0 <= gamma <= MASK
        assert bin(gamma ^ (gamma >> 1)).count("1") >= 24


@pytest.mark.parametrize(
    ("seed", "gamma_source"), [(0, 1), (MASK, 2**63), (0x0123456789ABCDEF, 0xFEDCBA9876543210)]
)
def test_torch_implementation_matches_the_definition(seed: int, gamma_source: int) -> None:
    gamma = mix_gamma(gamma_source)
    got = reference_pairs(257, seed, gamma, 2.5).double().numpy()
    np.testing.assert_allclose(got, expected_pairs(257, seed, gamma, 2.5), rtol=2e-5, atol=2e-5)


@pytest.mark.skipif(not gaussian.native_kernel_available(), reason="no C compiler here")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("pairs", [0, 1, 1023, 1024, 1025, 50_001])
def test_compiled_kernel_matches_the_torch_implementation(pairs: int, threads: int) -> None:
    kernel = gaussian._native()
    assert kernel is not None
    seed, gamma = 0xDEADBEEFCAFEF00D, mix_gamma(12345)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = kernel.pairs(pairs, seed, gamma, 0.75)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got, reference_pairs(pairs, seed, gamma, 0.75), rtol=1e-5, atol=1e-5)


def test_draws_are_standard_normal_and_bounded() -> None:
    generator = torch.Generator().manual_seed(3)
    values = gaussian_noise(1_000_001, 1.0, generator, torch.zeros(1)).double().numpy()
    assert values.shape == (1_000_001,)
    # Fixed seed, so these are deterministic; the tolerances are ~5 standard errors.
    assert abs(values.mean()) < 5 / math.sqrt(values.size)
    assert abs(values.std() - 1) < 5 * math.sqrt(0.5 / values.size)
    assert stats.kstest(values, "norm").pvalue > 0.01
    assert abs(stats.skew(values)) < 5 * math.sqrt(6 / values.size)
    assert abs(stats.kurtosis(values)) < 5 * math.sqrt(24 / values.size)
    # The tail's 104-bit uniforms bound the radius: sqrt(-2 ln 2^-104).
    assert np.abs(values).max() <= math.sqrt(208 * math.log(2)) + 1e-5
    # The cosine half and the sine half of the pairs are uncorrelated.
    half = values.size // 2
    assert abs(np.corrcoef(values[:half], values[half : 2 * half])[0, 1]) < 5 / math.sqrt(half)


def test_consecutive_draws_are_independent_streams() -> None:
    generator = torch.Generator().manual_seed(5)
    first = gaussian_noise(200_000, 1.0, generator, torch.zeros(1)).double().numpy()
    second = gaussian_noise(200_000, 1.0, generator, torch.zeros(1)).double().numpy()
    assert abs(np.corrcoef(first, second)[0, 1]) < 5 / math.sqrt(first.size)
    # float32 values do collide by chance (~1e3 here); a repeated stream would show up as many
    # collisions at one index offset.
    _, in_first, in_second = np.intersect1d(first, second, return_indices=True)
    assert np.unique(in_second - in_first, return_counts=True)[1].max() <= 3


def test_same_generator_state_replays_and_consumes_four_draws() -> None:
    a = gaussian_noise(1001, 0.5, torch.Generator().manual_seed(11), torch.zeros(1))
    b = gaussian_noise(1001, 0.5, torch.Generator().manual_seed(11), torch.zeros(1))
    c = gaussian_noise(1001, 0.5, torch.Generator().manual_seed(12), torch.zeros(1))
    assert torch.equal(a, b) and not torch.equal(a, c)
    used, fresh = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    gaussian_noise(10_000, 1.0, used, torch.zeros(1))
    torch.randint(0, 1 << 32, (4,), generator=fresh, dtype=torch.int64)
    assert torch.equal(used.get_state(), fresh.get_state())


@pytest.mark.parametrize("compiled", [True, False])
def test_a_key_drawn_now_gives_the_generators_values_later_and_in_place(
    compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not compiled:
        monkeypatch.setattr(gaussian, "_native", lambda: None)
    expected = gaussian_noise(5001, 0.7, torch.Generator().manual_seed(21), torch.zeros(1))
    generator = torch.Generator().manual_seed(21)
    key = gaussian.NoiseKey.draw(generator)
    fresh = torch.Generator().manual_seed(21)
    torch.randint(0, 1 << 32, (4,), generator=fresh, dtype=torch.int64)
    assert torch.equal(generator.get_state(), fresh.get_state())  # four draws, as a draw uses
    assert torch.equal(gaussian_noise(5001, 0.7, key, torch.zeros(1)), expected)
    out = torch.full((5002,), math.nan)
    gaussian.fill_gaussian(out, key, 0.7)
    assert torch.equal(out[:5001], expected)
    with pytest.raises(ValueError, match="even"):
        gaussian.fill_gaussian(torch.zeros(5001), key, 0.7)


def test_values_follow_likes_dtype_and_scale_with_std() -> None:
    like = torch.zeros(1, dtype=torch.float64)
    unit = gaussian_noise(999, 1.0, torch.Generator().manual_seed(1), like)
    scaled = gaussian_noise(999, 3.0, torch.Generator().manual_seed(1), like)
    assert unit.dtype == torch.float64 and unit.shape == (999,)
    torch.testing.assert_close(scaled, 3.0 * unit, rtol=1e-6, atol=1e-6)
    assert gaussian_noise(0, 1.0, torch.Generator(), like).shape == (0,)
    with pytest.raises(ValueError):
        gaussian_noise(-1, 1.0, torch.Generator(), like)


@pytest.mark.skipif(not gaussian.native_kernel_available(), reason="no C compiler here")
def test_torch_fallback_draws_the_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = gaussian_noise(30_001, 1.0, torch.Generator().manual_seed(9), torch.zeros(1))
    monkeypatch.setattr(gaussian, "_native", lambda: None)
    slow = gaussian_noise(30_001, 1.0, torch.Generator().manual_seed(9), torch.zeros(1))
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)


def test_a_failing_compiler_falls_back_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no cached build to find
    monkeypatch.delenv("FEDSIM_PURE_TORCH_NOISE", raising=False)
    monkeypatch.setenv("CC", "false")  # exists and always fails
    assert gaussian._load_kernel() is None
    monkeypatch.setenv("CC", "no-such-compiler-here")
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    assert gaussian._load_kernel() is None
    # Where the warning goes depends on who configured logging (fedsim.logging): the CLI's
    # structlog lines on stderr, or, as a library, the standard library's fedsim.* loggers.
    output = capsys.readouterr()
    seen = output.out + output.err + caplog.text
    assert "could not build the Gaussian noise kernel" in seen
    assert "no C compiler found" in seen


def test_pure_torch_switch_skips_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDSIM_PURE_TORCH_NOISE", "1")
    assert gaussian._load_kernel() is None


@pytest.mark.skipif(not gaussian.native_kernel_available(), reason="no C compiler here")
def test_a_failing_build_recipe_falls_through_to_the_next(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(native, "RECIPES", (
        (("-O3", "-fPIC", "--no-such-flag"), ("-shared", "-lm")),  # what a lesser compiler rejects
        (("-O3", "-fPIC"), ("-shared", "-lm")),
    ))
    kernel = gaussian._load_kernel()
    assert kernel is not None
    key = (7, mix_gamma(8), 1.0)
    torch.testing.assert_close(kernel.pairs(999, *key), reference_pairs(999, *key), rtol=1e-5, atol=1e-5)


def test_unmix64_inverts_mix64() -> None:
    rng = np.random.default_rng(4)
    for value in [0, 1, MASK, *(int(v) for v in rng.integers(0, 2**63, 200, dtype=np.int64))]:
        assert splitmix_output(gaussian.unmix64(value)) == value
        assert gaussian.unmix64(splitmix_output(value)) == value


TAIL_OUTPUTS = [0x0000_0012_3456_5678, 0x0000_00FF_FFFF_FFFF, 0x0000_0000_ABCD_0000]


@pytest.mark.parametrize("output", TAIL_OUTPUTS)
@pytest.mark.parametrize("compiled", [True, False])
def test_a_tail_pair_refines_u1_past_the_24_bit_floor(
    output: int, compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if compiled and not gaussian.native_kernel_available():
        pytest.skip("no C compiler here")
    if not compiled:
        monkeypatch.setattr(gaussian, "_native", lambda: None)
    pairs, index = 2049, 1500  # the tail pair in the second block of the kernel's 1,024
    key = gaussian.tail_key(pairs, index, output)
    assert splitmix_output((key.seed + (index + 1) * key.gamma) & MASK) == output
    out = torch.empty(2 * pairs)
    gaussian.fill_noise(out, key, 1.5)
    expected = expected_pairs(pairs, key.seed, key.gamma, 1.5)
    np.testing.assert_allclose(out.double().numpy(), expected, rtol=2e-5, atol=2e-5)
    radius = math.hypot(out[index].item(), out[pairs + index].item())
    # Below the old floor u1 = 2^-24 the radius exceeds the old cap 5.77 std.
    assert radius > 1.5 * math.sqrt(48 * math.log(2))


@pytest.mark.parametrize("compiled", [True, False])
def test_the_deepest_cell_reaches_twelve_standard_deviations(
    compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if compiled and not gaussian.native_kernel_available():
        pytest.skip("no C compiler here")
    if not compiled:
        monkeypatch.setattr(gaussian, "_native", lambda: None)
    pairs, index = 9, 4
    for extra in range(64):  # the first small output an odd gamma can place at pairs + index
        try:
            key = gaussian.tail_key(pairs, index, 0x0000_0000_7777_0000, extra)
            break
        except ValueError:
            continue
    else:
        pytest.fail("no key found")
    out = gaussian.gaussian_noise(2 * pairs, 1.0, key, torch.zeros(1))
    radius = math.hypot(out[index].item(), out[pairs + index].item())
    # u1 = (extra + 1) / 2^104: the radius only the refined tail can give.
    assert radius == pytest.approx(math.sqrt(-2 * math.log((extra + 1) * 2.0**-104)), rel=1e-6)
    assert radius > 11.9


def test_the_tail_has_the_gaussian_tails_distribution() -> None:
    # Given u1 <= 2^-24, a uniform u1 makes r^2 / 2 - 24 ln 2 an Exp(1) variable.
    rng = np.random.default_rng(8)
    excess = []
    for low in rng.integers(0, 2**40, 500, dtype=np.int64):
        key = gaussian.tail_key(1, 0, int(low))
        out = gaussian.gaussian_noise(2, 1.0, key, torch.zeros(1, dtype=torch.float64))
        excess.append((out[0].item() ** 2 + out[1].item() ** 2) / 2 - 24 * math.log(2))
    assert stats.kstest(excess, "expon").pvalue > 0.01
    assert max(excess) > 3  # beyond what the 24-bit floor (excess 0) allowed


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("index", [0, 1023, 1024, 9000, 10_006])
def test_tail_pairs_in_any_block_of_a_parallel_draw(index: int, threads: int) -> None:
    # 10,007 pairs: ten OpenMP blocks (more than 8, so two threads split them), the last one
    # partial; the tail pair at the first, a block's last and first, a middle and the last pair.
    if not gaussian.native_kernel_available():
        pytest.skip("no C compiler here")
    kernel = gaussian._native()
    assert kernel is not None
    pairs = 10_007
    key = gaussian.tail_key(pairs, index, 0x0000_0000_0123_4567)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = kernel.pairs(pairs, key.seed, key.gamma, 0.5)
    finally:
        torch.set_num_threads(before)
    expected = reference_pairs(pairs, key.seed, key.gamma, 0.5)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert math.hypot(got[index].item(), got[pairs + index].item()) > 0.5 * 5.77


def test_the_sync_free_tail_gives_the_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    # Accelerators take every pair's float64 tail radius where the tail is (no host sync); the
    # same rule as finding the tail pairs, checked here on the CPU.
    key = gaussian.tail_key(3001, 2000, 0x0000_0000_00F0_0F00)
    found = reference_pairs(3001, key.seed, key.gamma, 1.25)
    monkeypatch.setattr(gaussian, "_SYNC_FREE_TAIL", ("cpu",))
    assert torch.equal(reference_pairs(3001, key.seed, key.gamma, 1.25), found)


def test_pairs_outside_the_tail_keep_the_24_bit_sampler_values() -> None:
    # The tail rule changes only tail pairs: a draw with one tail pair equals the 24-bit
    # definition everywhere else (to float32 rounding of the log and cosine).
    pairs, index = 4099, 3000
    key = gaussian.tail_key(pairs, index, 0x0000_0001_0000_0001)
    out = gaussian.gaussian_noise(2 * pairs, 1.0, key, torch.zeros(1))
    z = [splitmix_output((key.seed + (i + 1) * key.gamma) & MASK) for i in range(pairs)]
    assert [i for i in range(pairs) if z[i] >> 40 == 0] == [index]
    old = expected_pairs(pairs, key.seed, key.gamma, 1.0)
    u1_old = 2.0**-24
    old[index] = old[pairs + index] = 0.0
    got = out.double().numpy().copy()
    tail_radius = math.hypot(got[index], got[pairs + index])
    got[index] = got[pairs + index] = 0.0
    np.testing.assert_allclose(got, old, rtol=2e-5, atol=2e-5)
    assert tail_radius > math.sqrt(-2 * math.log(u1_old))


def test_the_probe_refuses_a_kernel_that_caps_the_tail() -> None:
    # A kernel right everywhere but on tail pairs (the 24-bit floor kept, as before the tail
    # rule) passes a random key's probe and must fail the tail key's.
    class Capped:
        def pairs(self, pairs: int, seed: int, gamma: int, std: float) -> torch.Tensor:
            out = reference_pairs(pairs, seed, gamma, std)
            radius = torch.hypot(out[:pairs], out[pairs:])
            cap = std * math.sqrt(48 * math.log(2))
            shrink = torch.where(radius > cap, cap / radius, torch.ones_like(radius))
            return out * torch.cat([shrink, shrink])

    key = (1, mix_gamma(2), 1.0)  # a random key: no tail pair, the capped kernel is exact
    assert torch.equal(Capped().pairs(4099, *key), reference_pairs(4099, *key))
    assert not gaussian._agrees(Capped())  # type: ignore[arg-type]


@pytest.mark.parametrize("sync_free", [False, True])
def test_a_block_of_draws_gives_each_keys_own_values_to_the_bit(
        monkeypatch: pytest.MonkeyPatch, sync_free: bool) -> None:
    # reference_rows draws several keys at once (an accelerator's batched pass): each row is
    # its key's draw alone, tail pairs included (two keys with a tail pair, in rows 1 and 3),
    # each scaled by its own std; both ways of finding the tail.
    if sync_free:
        monkeypatch.setattr(gaussian, "_SYNC_FREE_TAIL", ("cpu",))
    pairs = 3001
    keys = [gaussian.NoiseKey(0x0123456789ABCDEF, mix_gamma(5)),
            gaussian.tail_key(pairs, 2000, 0x0000_0000_00F0_0F00),
            gaussian.NoiseKey(7, mix_gamma(8)),
            gaussian.tail_key(pairs, 17, 0x0000_0000_0123_4567)]
    stds = [1.0, 0.37, 2.5e-3, 4.0]
    rows = gaussian.reference_rows(keys, stds, pairs)
    assert rows.shape == (4, 2 * pairs) and rows.dtype == torch.float32
    for row, key, std in zip(rows, keys, stds, strict=True):
        assert torch.equal(row, reference_pairs(pairs, key.seed, key.gamma, std))
        # and the definition itself, from Python integers (each row its own key and std)
        np.testing.assert_allclose(row.double().numpy(), expected_pairs(pairs, key.seed, key.gamma, std),
                                   rtol=2e-5, atol=2e-5 * std)
    # the tail pairs reach past the 24-bit sampler's radius
    assert math.hypot(rows[1, 2000].item(), rows[1, pairs + 2000].item()) > 0.37 * 5.77
    assert gaussian.reference_rows([], [], pairs).shape == (0, 2 * pairs)
