"""CompiledLaunch (kernels/_launch.py): which launches take Triton's JIT path and which the compiled
kernel's launcher, and what the latter is given. A fake kernel stands in for the Gluon ones (which need
an sm_90 GPU; tests/kernels/test_flash_*_hopper.py run them through this path on the GPU)."""

from __future__ import annotations

import pytest
import torch
from triton import knobs
from triton.backends.nvidia import driver

from kernels import _launch
from kernels._launch import CompiledLaunch, TmaView, specialize_argument, tma_view
from tests.kernels._flash_utils import assert_compiled_launches_match_jit


class FakeCompiled:
    function = "function-handle"
    packed_metadata = "packed-metadata"

    def __init__(self):
        self.launches = []

    def run(self, *args):
        self.launches.append(args)


class FakeKernel:
    __name__ = "fake_kernel"

    def __init__(self, arg_names=("a_desc", "b_desc", "X", "n", "scale", "FLAG", "STAGES")):
        self.arg_names = list(arg_names)
        self.jit_launches = []
        self.compiled = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.jit_launches.append((grid, args, kwargs))
            self.compiled.append(FakeCompiled())
            return self.compiled[-1]

        return launch


@pytest.fixture(autouse=True)
def _no_gpu(monkeypatch):
    monkeypatch.setattr(knobs.runtime, "interpret", False)  # (as kernels defined for a GPU; CI sets it)
    monkeypatch.setattr(_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(_launch, "_current_stream", lambda device: 1234)
    monkeypatch.setattr(_launch, "ENABLED", True)


def _descriptor(t, rows):
    return ("gluon-descriptor", t, rows)


def _call(launch, a, b, x, n, flag=True, views=None):
    launch((3, 2, 1), ((a, 64), (b, 32)), (x, n, 0.5), dict(FLAG=flag, STAGES=2, num_warps=4), views)


def _tensors(seqlen=64):
    a, b = (torch.randn(2, seqlen, 4, 16) for _ in range(2))
    return a, b, torch.zeros(32)


def test_first_launch_is_jit_then_the_compiled_launcher_gets_views_and_every_parameter():
    kernel = FakeKernel()
    launch = CompiledLaunch(kernel, _descriptor)
    a, b, x = _tensors()
    _call(launch, a, b, x, 32)
    assert len(kernel.jit_launches) == 1 and launch.fast_launches == 0
    grid, args, kwargs = kernel.jit_launches[0]
    assert grid == (3, 2, 1)
    assert args[:2] == (("gluon-descriptor", a, 64), ("gluon-descriptor", b, 32)) and args[2:] == (x, 32, 0.5)
    assert kwargs == dict(FLAG=True, STAGES=2, num_warps=4)

    a2, b2, x2 = _tensors(seqlen=80)  # new tensors, same specialization (80 and 48 divisible by 16)
    _call(launch, a2, b2, x2, 48)
    assert len(kernel.jit_launches) == 1 and launch.fast_launches == 1
    (run_args,) = kernel.compiled[0].launches
    assert run_args[:9] == (3, 2, 1, 1234, "function-handle", "packed-metadata", None, None, None)
    view_a, view_b = run_args[9:11]
    assert view_a.base is a2 and view_b.base is b2 and view_a.shape == [2, 4, 80, 16]
    assert run_args[11:] == (x2, 48, 0.5, True, 2)  # the constexprs in parameter order, num_warps not


def test_constexprs_reach_the_launcher_in_parameter_order_whatever_the_keyword_order():
    kernel = FakeKernel()
    launch = CompiledLaunch(kernel, _descriptor)
    a, b, x = _tensors()
    for _ in range(2):
        launch((1, 1, 1), ((a, 64), (b, 32)), (x, 32, 0.5), dict(num_warps=4, STAGES=3, FLAG=False))
    (run_args,) = kernel.compiled[0].launches
    assert run_args[-2:] == (False, 3)


def test_a_shorter_grid_reaches_the_launcher_as_three_counts():
    kernel = FakeKernel()
    launch = CompiledLaunch(kernel, _descriptor)
    a, b, x = _tensors()
    for _ in range(2):
        launch((7,), ((a, 64), (b, 32)), (x, 32, 0.5), dict(FLAG=True, STAGES=2, num_warps=4))
    assert kernel.jit_launches[0][0] == (7, 1, 1)
    (run_args,) = kernel.compiled[0].launches
    assert run_args[:3] == (7, 1, 1)


def test_tma_view_is_the_batch_heads_seqlen_headdim_view():
    t = torch.empty(2, 5, 3, 8)  # (batch, seqlen, heads, headdim)
    view = tma_view(t)
    assert isinstance(view, TmaView) and view.base is t and view.padding == "zero"
    assert view.shape == [2, 3, 5, 8] and view.strides == [120, 8, 24, 1]
    packed = torch.empty(2, 5, 7, 8)[:, :, 2:5]  # heads sliced out of a packed tensor: strides kept
    assert tma_view(packed).strides == [280, 8, 56, 1] and tma_view(packed).shape == [2, 3, 5, 8]


@pytest.mark.parametrize(
    "change",
    ["int_not_divisible_by_16", "int_equal_to_one", "misaligned_pointer", "other_dtype", "other_constexpr",
     "other_head_dim"],
)  # fmt: skip
def test_a_launch_triton_would_specialize_differently_takes_the_jit_path(change):
    kernel = FakeKernel()
    launch = CompiledLaunch(kernel, _descriptor)
    a, b, x = _tensors()
    _call(launch, a, b, x, 32)
    n, flag = 32, True
    if change == "int_not_divisible_by_16":
        n = 33
    elif change == "int_equal_to_one":
        n = 1
    elif change == "misaligned_pointer":
        x = x[1:]  # 4 bytes past a 16-byte boundary
    elif change == "other_dtype":
        a, b = a.half(), b.half()
    elif change == "other_head_dim":  # (the same tile rows: the descriptors' blocks differ in their width)
        a, b = torch.randn(2, 64, 4, 32), torch.randn(2, 64, 4, 32)
    else:
        flag = False
    _call(launch, a, b, x, n, flag)
    assert len(kernel.jit_launches) == 2 and launch.fast_launches == 0
    _call(launch, a, b, x, n, flag)  # and that specialization is kept in turn
    assert len(kernel.jit_launches) == 2 and launch.fast_launches == 1


def test_a_given_specialization_keys_the_launch_as_its_own_would():
    """The tuned portable kernels pass the specialization their config key holds already
    (`_common._cached_config_run`): the launch takes the entry its own specialization would."""
    kernel = FakeKernel()
    launch = CompiledLaunch(kernel, _descriptor)
    a, b, x = _tensors()
    _call(launch, a, b, x, 32)
    constexprs = dict(FLAG=True, STAGES=2, num_warps=4)
    for n, jit_launches in ((32, 1), (33, 2)):
        args = (x, n, 0.5)
        given = tuple(map(specialize_argument, args))
        launch((3, 2, 1), ((a, 64), (b, 32)), args, constexprs, specialization=given)
        assert len(kernel.jit_launches) == jit_launches  # (33: not divisible by 16, another kernel)
    assert launch.fast_launches == 1


def test_views_are_shared_between_launches_of_one_call():
    kernel = FakeKernel()
    launch = CompiledLaunch(kernel, _descriptor)
    a, b, x = _tensors()
    _call(launch, a, b, x, 32)
    views = {}
    _call(launch, a, b, x, 32, views=views)
    _call(launch, a, b, x, 32, views=views)
    first, second = kernel.compiled[0].launches
    assert first[9] is second[9] and first[10] is second[10]
    assert set(views) == {id(a), id(b)}


def test_a_launch_hook_or_the_switch_sends_every_launch_to_the_jit_path(monkeypatch):
    kernel = FakeKernel()
    launch = CompiledLaunch(kernel, _descriptor)
    a, b, x = _tensors()
    _call(launch, a, b, x, 32)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    _call(launch, a, b, x, 32)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", None)
    chain = knobs.HookChain()
    chain.add(lambda metadata: None)
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", chain)  # (as proton adds its hooks)
    _call(launch, a, b, x, 32)
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", knobs.HookChain())  # empty: Triton's default
    _call(launch, a, b, x, 32)
    assert len(kernel.jit_launches) == 3 and launch.fast_launches == 1
    monkeypatch.setattr(_launch, "ENABLED", False)
    _call(launch, a, b, x, 32)
    assert len(kernel.jit_launches) == 4 and launch.fast_launches == 1


def test_a_kernel_whose_constexprs_are_not_last_is_refused():
    kernel = FakeKernel(arg_names=("a_desc", "b_desc", "FLAG", "X", "n", "scale", "STAGES"))
    launch = CompiledLaunch(kernel, _descriptor)
    a, b, x = _tensors()
    with pytest.raises(TypeError, match="descriptors, arguments, constexprs"):
        _call(launch, a, b, x, 32)


# ---- the C launcher below Triton's descriptor wrapper ----------------------------------------------


def _fake_encoding(arg, meta):
    """Stands in for Triton's make_tensordesc_arg (which needs a GPU): [descriptor, *shape, *strides]."""
    return [("tensor-map", arg.base.data_ptr(), tuple(arg.shape), tuple(arg.strides), meta["block"]), *arg.shape,
            *arg.strides]  # fmt: skip


class FakeCudaLauncher:
    """Triton 3.6's CudaLauncher as a compiled kernel's `run`: its `launch` is the real
    `wrap_handle_tensordesc` over a C launcher that records what it gets."""

    launch_cooperative_grid = False
    launch_pdl = True

    def __init__(self, metas, scratch=0, signature=None):
        self.c_launches = []
        signature = signature or {0: "tensordesc<fp32[1,1,64,16]>", 1: "tensordesc<fp32[1,1,32,16]>", 2: "*fp32",
                                  3: "i32", 4: "fp32", 5: "constexpr", 6: "constexpr"}  # fmt: skip
        self.launch = driver.wrap_handle_tensordesc(
            lambda *args: self.c_launches.append(args), signature, metas
        )
        self.global_scratch_size = scratch
        self.profile_scratch_size = 0

    def __call__(self, grid_x, grid_y, grid_z, stream, function, *args):  # CudaLauncher.__call__, no scratch
        self.launch(grid_x, grid_y, grid_z, stream, function, self.launch_cooperative_grid, self.launch_pdl, None,
                    None, *args)  # fmt: skip


class FakeCompiledWithLauncher:
    function = "function-handle"
    packed_metadata = "packed-metadata"

    def __init__(self, **launcher_options):
        self.run = FakeCudaLauncher(**launcher_options)


class FakeKernelWithLauncher(FakeKernel):
    def __init__(self, **launcher_options):
        super().__init__()
        self.launcher_options = dict(metas=[{"block": 64}, {"block": 32}]) | launcher_options

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.jit_launches.append((grid, args, kwargs))
            self.compiled.append(FakeCompiledWithLauncher(**self.launcher_options))
            return self.compiled[-1]

        return launch


@pytest.fixture
def fake_encoding(monkeypatch):
    monkeypatch.setattr(driver, "make_tensordesc_arg", _fake_encoding)  # Triton's wrapper, on the run path
    monkeypatch.setattr(_launch, "make_tensordesc_arg", _fake_encoding)


def test_the_c_launcher_gets_what_tritons_own_launcher_would_pass_it(fake_encoding):
    kernel = FakeKernelWithLauncher()
    launch = CompiledLaunch(kernel, _descriptor)
    a, b, x = _tensors()
    _call(launch, a, b, x, 32)
    a2, b2, x2 = _tensors(seqlen=80)
    _call(launch, a2, b2, x2, 48)
    assert launch.fast_launches == 1
    runner = kernel.compiled[0].run
    (fast,) = runner.c_launches
    # the same launch through Triton's run, with the views it encodes itself
    runner(3, 2, 1, 1234, "function-handle", "packed-metadata", None, None, None, tma_view(a2), tma_view(b2), x2,
           48, 0.5, True, 2)  # fmt: skip
    assert fast == runner.c_launches[1]
    assert fast[:13] == (3, 2, 1, 1234, "function-handle", False, True, None, None, "packed-metadata", None, None,
                         None)  # fmt: skip
    assert fast[13] == ("tensor-map", a2.data_ptr(), (2, 4, 80, 16), (5120, 16, 64, 1), 64)
    assert fast[-5:] == (x2, 48, 0.5, True, 2)


def test_a_descriptor_is_encoded_once_per_address_shape_and_strides(fake_encoding):
    kernel = FakeKernelWithLauncher()
    launch = CompiledLaunch(kernel, _descriptor)
    a, b, x = _tensors()
    _call(launch, a, b, x, 32)  # (the JIT launch: Triton encodes)
    for _ in range(3):
        _call(launch, a, b, x, 32)
    assert launch.fast_launches == 3 and launch.encodings == 2
    a.normal_()  # new values at the same address: the same descriptor
    _call(launch, a, b, x, 32)
    assert launch.encodings == 2
    _call(launch, b, a, x, 32)  # each descriptor keeps its own block shape: both encoded again
    assert launch.encodings == 4
    packed = torch.randn(2, 64, 8, 16)
    _call(launch, packed[:, :, :4], b, x, 32)  # another address, and strides of a packed tensor
    _call(launch, packed[:, :, 4:], b, x, 32)  # same strides, another address
    _call(launch, packed[:, :32, :4], b, x, 32)  # same address as the first, another shape
    assert launch.encodings == 7
    runner = kernel.compiled[0].run
    assert runner.c_launches[-1][13] == (
        "tensor-map",
        packed.data_ptr(),
        (2, 4, 32, 16),
        (8192, 16, 128, 1),
        64,
    )
    assert runner.c_launches[-2][13][1:4] == (
        packed.data_ptr() + 4 * 16 * 4,
        (2, 4, 64, 16),
        (8192, 16, 128, 1),
    )


def test_a_view_given_whole_is_keyed_by_its_block_and_encoded_once_per_address_shape_and_strides(
    fake_encoding,
):
    """A descriptor given as a TmaView with its block (the one-kernel backward's dq view of rows paired,
    `_flash_bwd_fused_hopper.dq_view`) reaches the descriptor factory and the encoding as it is; another block
    is another specialization, another view of the same address another encoding."""
    kernel = FakeKernelWithLauncher()
    launch = CompiledLaunch(kernel, _descriptor)
    a, b, x = _tensors()

    def paired(t, block=(1, 8, 4, 2, 16), groups=8):
        return TmaView(t, [2, groups, 4, 2, 64], [4096, 512, 64, 256, 1], block=block)

    for _ in range(3):
        launch((3, 2, 1), ((paired(a), 64), (b, 32)), (x, 32, 0.5), dict(FLAG=True, STAGES=2, num_warps=4))
    assert len(kernel.jit_launches) == 1 and launch.fast_launches == 2 and launch.encodings == 2
    assert kernel.jit_launches[0][1][0] == ("gluon-descriptor", paired(a), 64)
    runner = kernel.compiled[0].run
    assert runner.c_launches[-1][13] == (
        "tensor-map",
        a.data_ptr(),
        (2, 8, 4, 2, 64),
        (4096, 512, 64, 256, 1),
        64,
    )
    launch(
        (3, 2, 1), ((paired(a, groups=4), 64), (b, 32)), (x, 32, 0.5), dict(FLAG=True, STAGES=2, num_warps=4)
    )
    assert launch.fast_launches == 3 and launch.encodings == 3  # (same block: the same kernel, encoded anew)
    launch((3, 2, 1), ((paired(a, block=(1, 4, 4, 2, 16)), 64), (b, 32)), (x, 32, 0.5),
           dict(FLAG=True, STAGES=2, num_warps=4))  # fmt: skip
    assert len(kernel.jit_launches) == 2  # (another block: Triton's launch, another compiled kernel)


def test_the_encoded_descriptors_kept_are_bounded(fake_encoding, monkeypatch):
    monkeypatch.setattr(_launch, "MAX_ENCODED", 3)
    kernel = FakeKernelWithLauncher()
    launch = CompiledLaunch(kernel, _descriptor)
    a, b, x = _tensors()
    _call(launch, a, b, x, 32)
    alive = [_tensors()[:2] for _ in range(4)]  # (kept: a freed tensor's address could come back)
    for a, b in alive:
        _call(launch, a, b, x, 32)
    (entry,) = launch._compiled.values()
    assert len(entry.encoded) <= 3 and launch.encodings == 8
    c_launches = kernel.compiled[0].run.c_launches
    assert len(c_launches) == 4 and c_launches[-1][13][0] == "tensor-map"


@pytest.mark.parametrize(
    "launcher_options",
    [
        dict(scratch=256),  # scratch memory Triton would allocate per launch
        dict(metas=None),  # descriptors without their metadata: Triton passes them decomposed
        dict(metas=[{"block": 64}, None]),  # one descriptor without its metadata
        dict(
            signature={
                0: "*fp32",
                1: "tensordesc<fp32[1,1,32,16]>",
                2: "tensordesc<fp32[1,1,64,16]>",
                3: "i32",
                4: "fp32",
                5: "constexpr",
                6: "constexpr",
            }
        ),  # descriptors elsewhere  # fmt: skip
    ],
)
def test_a_launcher_not_as_expected_keeps_the_run_path(fake_encoding, launcher_options):
    kernel = FakeKernelWithLauncher(**launcher_options)
    launch = CompiledLaunch(kernel, _descriptor)
    a, b, x = _tensors()
    _call(launch, a, b, x, 32)
    assert launch._compiled[next(iter(launch._compiled))].c_launcher is None
    calls = []
    kernel.compiled[0].run = lambda *args: calls.append(args)  # (the run path's launcher)
    _call(launch, a, b, x, 32)
    assert launch.fast_launches == 1 and launch.encodings == 0
    ((*_, view_a, view_b, _x, _n, _scale, _flag, _stages),) = calls
    assert view_a.base is a and view_b.base is b


def test_encode_once_off_takes_the_run_path(fake_encoding, monkeypatch):
    kernel = FakeKernelWithLauncher()
    launch = CompiledLaunch(kernel, _descriptor)
    a, b, x = _tensors()
    _call(launch, a, b, x, 32)
    monkeypatch.setattr(_launch, "ENCODE_ONCE", False)
    _call(launch, a, b, x, 32)
    runner = kernel.compiled[0].run
    assert launch.fast_launches == 1 and launch.encodings == 0
    (through_run,) = runner.c_launches  # Triton's wrapper encoded it, from the views it was given
    assert through_run[13] == ("tensor-map", a.data_ptr(), (2, 4, 64, 16), (4096, 16, 64, 1), 64)


def _gluon_launches(monkeypatch) -> list:
    """Records (kernel name, constexpr names) of every CompiledLaunch call instead of launching, each
    checked with `check_parameters` (which raises as the first real launch would)."""
    calls = []

    def record(self, grid, descriptors, args, kwargs, views=None):
        calls.append((self.kernel.__name__, self.check_parameters(descriptors, args, kwargs)))

    monkeypatch.setattr(CompiledLaunch, "__call__", record)
    return calls


@pytest.mark.parametrize("causal", [False, True])
def test_every_gluon_launch_gives_each_of_its_kernels_constexprs(monkeypatch, causal):
    """The Gluon kernels' launches (forward, dq, dK/dV, the one-kernel backward; every config table's
    configs) give each constexpr of their kernel by name: the check runs only at a GPU's first launch, so
    a constexpr left at its default would otherwise fail there first."""
    from kernels import _block_sparse_hopper as bs
    from kernels import _flash_bwd_fused_hopper as fused
    from kernels import _flash_dkdv_hopper as dkdv
    from kernels import _flash_dq_hopper as dq
    from kernels import _flash_fwd_hopper as fwd

    calls = _gluon_launches(monkeypatch)
    for d in (64, 128):
        q = torch.randn(1, 256, 2, d, dtype=torch.bfloat16)
        lse = torch.zeros(1, 2, 256)
        fwd_configs = [fwd.CONFIGS[d], fwd.PERSISTENT_CONFIGS[d], fwd.PINGPONG_CONFIGS[d], bs.CONFIGS[d][0]]
        for cfg in fwd_configs:
            fwd.flash_attn_forward_hopper(q, q, q, sm_scale=0.1, causal=causal, config=cfg)
        dq_configs = [bs.CONFIGS[d][1], bs.PERSISTENT_DQ[d][0], *([dq.CONFIGS[d]] if d in dq.CONFIGS else [])]
        for cfg in dq_configs:
            dq.flash_attn_dq_hopper(q, q, q, q, q, lse, lse, q, sm_scale=0.1, causal=causal, config=cfg)
        for cfg in (dkdv.CONFIGS[d], bs.CONFIGS[d][2], bs.PERSISTENT_DKDV[d][0]):
            dkdv.flash_attn_dkdv_hopper(q, q, q, q, q, q, lse, lse, sm_scale=0.1, causal=causal, config=cfg)
        acc = torch.zeros(1, 256, 2, d)
        for ordered, convoy in ((False, False), (True, False), (True, True)) if d in fused.CONFIGS else ():
            fused.flash_attn_bwd_fused_hopper(
                q, q, q, q, lse, lse, acc, q, q, sm_scale=0.1, causal=causal, ordered=ordered, convoy=convoy
            )
    kernels = {name for name, _ in calls}
    assert len(calls) == 2 * (4 + 2 + 3) + 1 + 3  # (d128's dq CONFIGS entry, its one-kernel backward's)
    assert {"_attn_fwd_hopper", "_attn_fwd_hopper_persistent", "_attn_bwd_dq_hopper",
            "_attn_bwd_dq_hopper_persistent", "_attn_bwd_dkdv_hopper", "_attn_bwd_dkdv_hopper_persistent",
            "_attn_bwd_fused_hopper"} == kernels  # fmt: skip


# ---- plain Triton kernels (no descriptors: the backward's delta preprocess) ------------------------


class FakeCLauncher:
    """A compiled extension's launch function: callable, no Python code object (as Triton's C launcher)."""

    def __init__(self):
        self.launches = []

    def __call__(self, *args):
        self.launches.append(args)


class FakePlainCudaLauncher:
    """Triton 3.6's CudaLauncher for a kernel without descriptors: `wrap_handle_tensordesc` returned the C
    launcher itself."""

    launch_cooperative_grid = False
    launch_pdl = False

    def __init__(self, launch=None, scratch=0):
        self.launch = launch if launch is not None else FakeCLauncher()
        self.global_scratch_size = scratch
        self.profile_scratch_size = 0
        self.runs = []

    def __call__(self, *args):
        self.runs.append(args)


class FakePlainKernel(FakeKernel):
    def __init__(self, **launcher_options):
        super().__init__(arg_names=("X", "Y", "n", "BLOCK", "FLAG"))
        self.launcher_options = launcher_options

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.jit_launches.append((grid, args, kwargs))
            compiled = FakeCompiled()
            compiled.run = FakePlainCudaLauncher(**self.launcher_options)
            self.compiled.append(compiled)
            return compiled

        return launch


def _plain_call(launch, x, y, n):
    launch((5, 2, 1), (), (x, y, n), dict(BLOCK=64, FLAG=False))


def test_a_plain_kernel_after_its_first_launch_goes_to_the_c_launcher_with_every_parameter():
    kernel = FakePlainKernel()
    launch = CompiledLaunch(kernel)
    x = torch.zeros(32)
    _plain_call(launch, x, None, 64)
    assert len(kernel.jit_launches) == 1 and launch.fast_launches == 0
    assert kernel.jit_launches[0][1:] == ((x, None, 64), dict(BLOCK=64, FLAG=False))
    x2 = torch.zeros(48)
    _plain_call(
        launch, x2, None, 96
    )  # (None: Triton makes it a constexpr, passed in its place as jit.py does)
    assert len(kernel.jit_launches) == 1 and launch.fast_launches == 1
    (c_args,) = kernel.compiled[0].run.launch.launches
    # CudaLauncher.__call__'s arguments to its C launcher, then `run`'s: jit.py's order
    assert c_args == (5, 2, 1, 1234, "function-handle", False, False, None, None, "packed-metadata", None, None,
                      None, x2, None, 96, 64, False)  # fmt: skip
    assert kernel.compiled[0].run.runs == []  # (not through `run`)
    _plain_call(launch, x2, x, 96)  # a pointer where None was: another specialization, compiled again
    assert len(kernel.jit_launches) == 2


@pytest.mark.parametrize("launcher", ["python_wrapper", "scratch"])
def test_a_plain_kernel_whose_launcher_is_not_the_c_one_keeps_the_run_path(launcher):
    options = dict(launch=lambda *args: None) if launcher == "python_wrapper" else dict(scratch=128)
    kernel = FakePlainKernel(**options)
    launch = CompiledLaunch(kernel)
    x = torch.zeros(32)
    for _ in range(2):
        _plain_call(launch, x, None, 64)
    runner = kernel.compiled[0].run
    assert launch.fast_launches == 1
    assert runner.runs == [(5, 2, 1, 1234, "function-handle", "packed-metadata", None, None, None, x, None, 64, 64,
                            False)]  # fmt: skip


def test_under_the_interpreter_every_launch_is_tritons_own(monkeypatch):
    monkeypatch.setattr(knobs.runtime, "interpret", True)
    monkeypatch.setattr(_launch, "_current_device", lambda: pytest.fail("no device under the interpreter"))
    kernel = FakePlainKernel()
    launch = CompiledLaunch(kernel)
    x = torch.zeros(32)
    for _ in range(3):
        _plain_call(launch, x, None, 64)
    assert len(kernel.jit_launches) == 3 and launch.fast_launches == 0
    gluon = CompiledLaunch(FakeKernel(), _descriptor)
    a, b, x = _tensors()
    with pytest.raises(RuntimeError, match="takes TMA descriptors"):
        _call(gluon, a, b, x, 32)


def test_the_delta_preprocess_matches_its_reference(device):
    """backward_delta through its CompiledLaunch (on CPU the interpreter's path): rowsum(dO * O)."""
    from kernels._flash_bwd import backward_delta

    out, do = torch.randn(2, 37, 3, 40, device=device), torch.randn(2, 37, 3, 40, device=device)
    lse = torch.zeros(2, 3, 37, device=device)
    delta = backward_delta(out, do, lse)
    torch.testing.assert_close(delta, (out * do).sum(-1).transpose(1, 2), rtol=1e-5, atol=1e-5)


# ---- on a GPU: the plain kernels' compiled launches against Triton's own ---------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["dense", "varlen", "dlse"])
def test_gpu_the_delta_preprocess_compiled_launch_matches_tritons(monkeypatch, case):
    from kernels import _flash_bwd

    monkeypatch.undo()  # (the autouse CPU fakes: this one runs on the device)
    torch.manual_seed(0)
    out, do = (torch.randn(2, 300, 4, 80, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(2, 4, 300, device="cuda")
    if case == "varlen":  # packed (total, heads, dim), lse (heads, total)
        out, do = out.view(600, 4, 80), do.view(600, 4, 80)
        lse = torch.randn(4, 600, device="cuda")
        cu = torch.tensor([0, 17, 450, 600], device="cuda", dtype=torch.int32)
        run = lambda: [_flash_bwd.backward_delta(out, do, lse, cu, 433)]  # noqa: E731
    elif case == "dlse":
        dlse = torch.randn_like(lse)
        run = lambda: [_flash_bwd.backward_delta(out, do, lse, dlse=dlse, dlse_scale=1.4426950408889634)]  # noqa: E731
    else:
        run = lambda: [_flash_bwd.backward_delta(out, do, lse)]  # noqa: E731
    assert_compiled_launches_match_jit(monkeypatch, [[_flash_bwd._launch_preprocess]], run)
    if case == "dense":  # and against rowsum(dO * O)
        want = (out.float() * do.float()).sum(-1).transpose(1, 2)
        torch.testing.assert_close(run()[0], want, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("seqlen_q, causal, window", [(1, False, None), (3, True, (100, 0))])
def test_gpu_the_decode_kernels_compiled_launches_match_tritons(monkeypatch, seqlen_q, causal, window):
    from kernels import decode, flash_decode

    monkeypatch.undo()
    torch.manual_seed(1)
    q = torch.randn(3, seqlen_q, 8, 64, device="cuda", dtype=torch.bfloat16)
    k_cache, v_cache = (torch.randn(3, 2000, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lengths = torch.tensor([2000, 1, 777], device="cuda", dtype=torch.int32)
    run = lambda: flash_decode(q, k_cache, v_cache, lengths, causal=causal, window=window, return_lse=True)  # noqa: E731
    assert_compiled_launches_match_jit(monkeypatch, [[decode._launch_split], [decode._launch_merge]], run)


def _portable_case(case):
    """(fn of no arguments -> (out, dq, dk, dv), the tuned portable kernels it launches): bf16 calls
    that the Gluon kernels do not take (or, at d64, take but for dq)."""
    from kernels import _flash_bwd, _flash_fwd, flash_attention, flash_attention_varlen

    fwd, dq, dkdv = _flash_fwd._attn_fwd_tuned, _flash_bwd._bwd_dq_tuned, _flash_bwd._bwd_dkdv_tuned
    shape = (2, 384, 4, 64) if case != "d64" else (2, 1024, 4, 64)
    q, k, v, do = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    kwargs, tuned = dict(causal=True), (fwd, dq, dkdv)
    if case == "window":
        kwargs["window"] = (100, 0)
    elif case == "key_padding":
        kwargs = dict(
            key_padding_mask=torch.arange(384, device="cuda")[None, :]
            < torch.tensor([[300], [384]], device="cuda")
        )
    elif case == "dropout":
        kwargs["dropout_p"] = 0.1
    elif case == "d64":  # (the Gluon forward and dK/dV, the portable dq)
        tuned = (dq,)
    if case == "varlen":
        cu = torch.tensor([0, 100, 768], device="cuda", dtype=torch.int32)
        q, k, v, do = (t.view(768, 4, 64) for t in (q, k, v, do))
        forward = lambda q, k, v: flash_attention_varlen(q, k, v, cu, cu, 668, 668, causal=True)  # noqa: E731
    else:
        forward = lambda q, k, v: flash_attention(q, k, v, **kwargs)  # noqa: E731

    def run():
        torch.manual_seed(3)  # (dropout's seed is drawn from it)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = forward(*leaves)
        out.backward(do)
        return [out.detach(), *(t.grad for t in leaves)]

    return run, tuned


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["window", "key_padding", "varlen", "dropout", "d64"])
def test_gpu_the_portable_kernels_compiled_launches_match_tritons(monkeypatch, case):
    """The autotuned portable kernels, once a key is tuned, launch through `CompiledLaunch`
    (`_common._cached_config_run`): out and every gradient bit-identical to Triton's launches."""
    monkeypatch.undo()
    torch.manual_seed(2)
    run, tuned = _portable_case(case)
    run()  # (tunes each key: the compiled launches start from the second call)
    assert_compiled_launches_match_jit(monkeypatch, [[t.compiled_launch] for t in tuned], run)
