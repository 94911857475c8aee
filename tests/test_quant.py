"""parmem.quant against the libraries themselves, run on CPU (bitsandbytes 0.50.2,
Transformers 5.23.0, galore-torch 1.0): every expected number is the bytes of the tensors the
library keeps, counted here, or a published figure (QLoRA, Dettmers et al. 2023).

* 4-bit weights: ``bnb.functional.quantize_4bit`` on CPU tensors (its CPU/default kernels) and
  on meta tensors (its fake kernels, which allocate as the CUDA kernels do), for shapes that do
  and do not divide into blocks; the packed data and every tensor of the ``QuantState``.
* Models: tiny Llama, Mixtral, Qwen3-MoE, Qwen2-MoE, Phi-3 and GPT-2 saved in bf16 and loaded by
  ``from_pretrained(..., quantization_config=BitsAndBytesConfig(...), device_map="cpu")``; and
  every family parmem reads, built on the meta device and converted by Transformers' own
  ``Bnb4BitHfQuantizer.preprocess_model`` (``pre_quantized=False``, as ``from_pretrained`` does
  for a 16-bit checkpoint), each ``Linear4bit`` weight quantized on the meta device.
* Dequantization transients: the tensors bitsandbytes materialises in a forward and backward,
  tracked while alive under a ``TorchDispatchMode``.
* Optimizers: one step of bitsandbytes' AdamW8bit, PagedAdamW8bit, PagedAdamW and AdamW and of
  galore_torch's GaLoreAdamW; the paged allocations recorded from ``init_state`` on the meta
  device.
"""

from __future__ import annotations

import tempfile
import weakref

import pytest

torch = pytest.importorskip("torch")
bnb = pytest.importorskip("bitsandbytes")
T = pytest.importorskip("transformers")
galore_torch = pytest.importorskip("galore_torch")

import bitsandbytes.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from transformers import BitsAndBytesConfig  # noqa: E402
from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer  # noqa: E402

from parmem import ModelSpec  # noqa: E402
from parmem.hfconfig import families  # noqa: E402
from parmem.quant import (  # noqa: E402
    bnb_optimizer_state_bytes,
    bnb_paged_state_bytes,
    bnb_tensors,
    dequant_transient_bytes,
    dequant_weight_bytes,
    galore_state_bytes,
    layer_weight_bytes,
    model_weight_bytes,
    outer_weight_bytes,
    weight_bytes_4bit,
    weight_bytes_int8,
)

pytestmark = pytest.mark.filterwarnings("ignore")
DTYPES = {"uint8": torch.uint8, "bfloat16": torch.bfloat16, "float32": torch.float32}
SHAPES = [(1, 1), (3, 5), (7, 9), (64, 64), (100, 300), (72, 36), (257, 1000)]
#: the tiny checkpoints written by _saved(), and their folder
_SAVED: dict[str, tuple[str, object]] = {}
_DIR = [""]


@pytest.fixture(autouse=True, scope="module")
def _checkpoints(tmp_path_factory):
    """The tiny checkpoints of this module live in one temporary folder (pytest removes it)."""
    _SAVED.clear()
    _DIR[0] = str(tmp_path_factory.mktemp("parmem-quant"))
    yield
    _SAVED.clear()


@pytest.fixture(autouse=True, scope="module")
def _dynamic_map_on_cpu():
    """quantize_blockwise caches its dynamic map on the first device it sees: seed it on CPU so
    that a meta-device call copies it instead of caching a meta tensor."""
    if "dynamic" not in F.name2qmap:
        F.name2qmap["dynamic"] = F.create_dynamic_map()
    yield


# ---------------------------------------------------------------------------- counting
def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _state_tensors(qs) -> list:
    """Every tensor of a QuantState, the nested one's included."""
    out = []
    for v in vars(qs).values():
        if torch.is_tensor(v):
            out.append(v)
        elif isinstance(v, F.QuantState):
            out += _state_tensors(v)
    return out


def _quantized_bytes(out, qs) -> int:
    """Bytes of the packed data and its quant state, each storage once."""
    seen = {}
    for t in [out, *_state_tensors(qs)]:
        key = t.untyped_storage().data_ptr() if t.device.type != "meta" else id(t)
        size = t.untyped_storage().nbytes() if t.device.type != "meta" else _nbytes(t)
        seen[key] = max(seen.get(key, 0), size)
    return sum(seen.values())


def _model_bytes(model) -> int:
    """Bytes of every parameter of a loaded model, with the quant states (Params4bit) and the
    row scales (Int8Params) they carry: each storage once (tied weights, CB = data)."""
    seen: dict[int, int] = {}

    def add(t):
        if t is not None:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()

    for p in model.parameters():
        add(p)
        if getattr(p, "quant_state", None) is not None:
            for t in _state_tensors(p.quant_state):
                add(t)
        add(getattr(p, "SCB", None))
        add(getattr(p, "CB", None))
    return sum(seen.values())


# ---------------------------------------------------------------------------- 4-bit weights
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("double_quant", [True, False])
def test_4bit_weight_bytes_match_quantize_4bit_on_cpu(shape, quant_type, double_quant):
    w = torch.randn(shape, dtype=torch.bfloat16)
    out, qs = F.quantize_4bit(
        w, blocksize=64, compress_statistics=double_quant, quant_type=quant_type
    )
    n = w.numel()
    assert _quantized_bytes(out, qs) == weight_bytes_4bit(n, quant_type, 64, double_quant)


@pytest.mark.parametrize("blocksize", [32, 128, 4096])
def test_4bit_block_sizes_on_cpu(blocksize):
    for shape in SHAPES:
        w = torch.randn(shape)
        out, qs = F.quantize_4bit(w, blocksize=blocksize, compress_statistics=True)
        assert _quantized_bytes(out, qs) == weight_bytes_4bit(w.numel(), "fp4", blocksize), shape


@pytest.mark.parametrize("storage", ["bfloat16", "float32"])
def test_4bit_wide_storage_on_cpu_and_refused_where_bitsandbytes_cannot_pack(storage):
    s = DTYPES[storage].itemsize
    for n in range(1, 70):
        w = torch.randn(n, dtype=torch.bfloat16)
        if -(-n // 2) % s == 0:
            out, qs = F.quantize_4bit(w, compress_statistics=True, quant_storage=DTYPES[storage])
            assert out.dtype == DTYPES[storage]
            assert _quantized_bytes(out, qs) == weight_bytes_4bit(n, storage=storage), n
        else:  # the CPU path cannot view the packed bytes as the wider dtype: refused
            with pytest.raises(RuntimeError):
                F.quantize_4bit(w, quant_storage=DTYPES[storage])
            with pytest.raises(ValueError, match="packed bytes must be a multiple"):
                weight_bytes_4bit(n, storage=storage)


@pytest.mark.parametrize("storage", ["uint8", "bfloat16"])
def test_4bit_bytes_on_the_meta_device_as_the_cuda_kernel_allocates(storage):
    """The fake kernels (_ops.py) allocate what the CUDA kernels allocate."""
    for shape in [*SHAPES, (4096, 11008), (152064, 8192)]:
        n = shape[0] * shape[1]
        if -(-n // 2) % DTYPES[storage].itemsize:
            continue
        w = torch.empty(shape, dtype=torch.bfloat16, device="meta")
        for dq in (True, False):
            out, qs = F.quantize_4bit(w, compress_statistics=dq, quant_storage=DTYPES[storage])
            assert _quantized_bytes(out, qs) == weight_bytes_4bit(n, "nf4", 64, dq, storage)


def test_qlora_paper_bits_per_parameter():
    """Dettmers et al. 2023, QLoRA, §3 "Double Quantization": blocks of 64 with an fp32 constant
    cost 32/64 = 0.5 bits per parameter; double quantization (8-bit constants, fp32 per 256
    blocks) 8/64 + 32/(64·256) = 0.127 bits: 4.127 bits for NF4."""
    n = 2**40
    dq = 8 * weight_bytes_4bit(n, double_quant=True) / n
    plain = 8 * weight_bytes_4bit(n, double_quant=False) / n
    assert round(dq, 3) == 4.127
    # the per-tensor constants (code tables, offset: 1092 B) add 8e-9 bits at this size
    assert abs(dq - (4 + 8 / 64 + 32 / (64 * 256))) < 1e-8
    assert abs(plain - 4.5) < 1e-9


@pytest.mark.parametrize("shape", SHAPES)
def test_int8_weight_bytes_match_int8params_on_cpu(shape):
    p = bnb.nn.Int8Params(torch.randn(shape, dtype=torch.bfloat16), requires_grad=False)
    p = p.to("cpu")  # Int8Params._quantize: CB (the data) and SCB
    assert p.dtype == torch.int8 and p.SCB.dtype == torch.float32
    assert _nbytes(p) + _nbytes(p.SCB) == weight_bytes_int8(*shape)
    assert p.CB.data_ptr() == p.data_ptr()


# ---------------------------------------------------------------------------- models
_SMALL = dict(
    hidden_size=72,
    intermediate_size=88,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    vocab_size=100,
)
_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=40)
TINY = {
    "llama": lambda: T.LlamaConfig(**_SMALL, head_dim=18),
    "llama_tied": lambda: T.LlamaConfig(**_SMALL, head_dim=18, tie_word_embeddings=True),
    "mixtral": lambda: T.MixtralConfig(**_SMALL, head_dim=18, num_local_experts=4),
    "qwen3_moe": lambda: T.Qwen3MoeConfig(**_SMALL, **_MOE, head_dim=18, num_experts=4),
    "qwen2_moe": lambda: T.Qwen2MoeConfig(
        **_SMALL, **_MOE, num_experts=4, shared_expert_intermediate_size=80
    ),
    "phi3": lambda: T.Phi3Config(**_SMALL, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "gpt2": lambda: T.GPT2Config(n_embd=72, n_head=4, n_layer=2, vocab_size=100, n_positions=32),
}
LOADS = {
    "nf4-dq": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True),
    "fp4": dict(load_in_4bit=True, bnb_4bit_quant_type="fp4"),
    "nf4-dq-bf16": dict(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_quant_storage=torch.bfloat16,
    ),
    "int8": dict(load_in_8bit=True),
}


def _saved(name: str):
    """A tiny bf16 checkpoint of ``name`` in a temporary folder (written once)."""
    if name not in _SAVED:
        cfg = TINY[name]()
        torch.manual_seed(0)
        model = T.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        path = tempfile.mkdtemp(prefix=f"{name}-", dir=_DIR[0])
        model.save_pretrained(path)
        _SAVED[name] = (path, cfg)
    return _SAVED[name]


def _load(name: str, load: str):
    path, cfg = _saved(name)
    kw = dict(LOADS[load], bnb_4bit_compute_dtype=torch.bfloat16)
    model = T.AutoModelForCausalLM.from_pretrained(
        path, quantization_config=BitsAndBytesConfig(**kw), dtype=torch.bfloat16, device_map="cpu"
    )
    return model, ModelSpec.from_hf_config(cfg.to_dict())


def _options(load: str) -> dict:
    kw = LOADS[load]
    if kw.get("load_in_8bit"):
        return dict(quant="int8")
    storage = {torch.bfloat16: "bfloat16"}.get(kw.get("bnb_4bit_quant_storage"), "uint8")
    return dict(
        quant=kw["bnb_4bit_quant_type"],
        double_quant=kw.get("bnb_4bit_use_double_quant", False),
        storage=storage,
    )


@pytest.mark.parametrize("load", list(LOADS))
@pytest.mark.parametrize("name", list(TINY))
def test_model_bytes_match_from_pretrained_on_cpu(name, load):
    model, spec = _load(name, load)
    ours = model_weight_bytes(spec, **_options(load))
    assert ours.total == _model_bytes(model)
    linear = (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)
    quantized = sum(
        m.weight.quant_state.shape.numel()
        if hasattr(m.weight, "quant_state") and m.weight.quant_state is not None
        else m.weight.numel()
        for m in model.modules()
        if isinstance(m, linear)
    )
    assert ours.quantized_params == quantized
    assert ours.quantized_params + ours.kept_params == spec.num_params()
    stages = sum(
        (layer_weight_bytes(spec, i, **_options(load)) for i in range(spec.layers)),
        outer_weight_bytes(spec, "first", **_options(load)),
    )
    assert (stages + outer_weight_bytes(spec, "last", **_options(load))) == ours


def test_moe_experts_stay_16_bit_and_shared_experts_are_quantized():
    model, spec = _load("qwen2_moe", "nf4-dq")
    mlp = model.model.layers[0].mlp
    assert mlp.experts.gate_up_proj.dtype == torch.bfloat16  # fused 3-D nn.Parameter
    assert isinstance(mlp.shared_expert.gate_proj, bnb.nn.Linear4bit)
    assert isinstance(mlp.shared_expert_gate, bnb.nn.Linear4bit)  # nn.Linear(h, 1)
    ours = {t.name: t.quantized for t in bnb_tensors(spec, 0)}
    assert not ours["experts.gate.weight"] and ours["shared_expert_gate.weight"]
    assert ours["shared_experts.gate.weight"] and not ours["router.weight"]


_FIX = {
    "ministral": {"head_dim": 128},
    "deepseek_v2": {"num_experts_per_tok": 6, "first_k_dense_replace": 1},
    "deepseek_v3": {"first_k_dense_replace": 1},
}


def _meta_bytes(model, options: dict, cache: dict) -> int:
    total = 0
    for name, p in model.named_parameters():
        module = model.get_submodule(name.rsplit(".", 1)[0])
        if isinstance(module, bnb.nn.Linear4bit) and name.endswith(".weight"):
            shape = (module.out_features, module.in_features)
            if shape not in cache:
                w = torch.empty(shape, dtype=torch.bfloat16, device="meta")
                out, qs = F.quantize_4bit(
                    w, compress_statistics=options["double_quant"], quant_type=options["quant"]
                )
                cache[shape] = _quantized_bytes(out, qs)
            total += cache[shape]
        else:  # the new Linear4bit's bias is fp32 on meta; from_pretrained loads it in bf16
            total += p.numel() * 2
    return total


@pytest.mark.parametrize("family", [f for f in families() if f not in ("gemma3", "llama4")])
def test_every_family_as_transformers_converts_it(family):
    """Transformers' own conversion (which modules become Linear4bit: fused projections,
    Conv1D, Falcon's FalconLinear left alone, routed experts left in bf16) on the family's default
    shapes with two layers, each weight quantized on the meta device."""
    cfg = T.AutoConfig.for_model(family, num_hidden_layers=2, **_FIX.get(family, {}))
    with torch.device("meta"):
        model = T.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_use_double_quant=True)
    Bnb4BitHfQuantizer(config, pre_quantized=False).preprocess_model(model, device_map={"": "cpu"})
    spec = ModelSpec.from_hf_config(cfg.to_dict())
    cache: dict = {}
    assert model_weight_bytes(spec).total == _meta_bytes(
        model, dict(quant="nf4", double_quant=True), cache
    )
    converted = any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
    assert converted == (family != "falcon")


# ---------------------------------------------------------------------------- transients
class _Transients(TorchDispatchMode):
    """Bytes alive of the tensors bitsandbytes materialises for a weight of one of ``shapes``
    (the dequantized weight, its dtype copies) and the fp32 absmax vectors of ``blocks``
    entries; each storage counted once while any tensor on it lives."""

    def __init__(self, shapes, blocks, skip):
        super().__init__()
        self.shapes, self.blocks, self.skip = set(shapes), set(blocks), skip
        self.refs: dict[int, int] = {}
        self.live = self.peak = 0
        self.seen: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if not torch.is_tensor(t) or t.device.type == "meta":
                continue
            absmax = t.dim() == 1 and t.dtype == torch.float32 and t.numel() in self.blocks
            if tuple(t.shape) not in self.shapes and not absmax:
                continue
            key = t.untyped_storage().data_ptr()
            if key in self.skip:
                continue
            if key not in self.refs:
                self.refs[key] = 0
                self.live += t.untyped_storage().nbytes()
                self.peak = max(self.peak, self.live)
                self.seen.append((str(func), t.dtype, tuple(t.shape)))
            self.refs[key] += 1
            weakref.finalize(t, self._drop, key, t.untyped_storage().nbytes())
        return out

    def _drop(self, key: int, nbytes: int) -> None:
        self.refs[key] -= 1
        if not self.refs[key]:
            del self.refs[key]
            self.live -= nbytes


def _track(modules, params):
    shapes = [(m.out_features, m.in_features) for m in modules]
    blocks = [-(-(a * b) // 64) for a, b in shapes]
    return _Transients(shapes, blocks, {p.untyped_storage().data_ptr() for p in params})


@pytest.mark.parametrize("double_quant", [True, False])
def test_linear4bit_keeps_only_the_packed_weight_and_dequantizes_transiently(double_quant):
    """bf16 weights, fp32 compute: the backward dequantizes to bf16 and copies to fp32."""
    rows, cols, tokens = 72, 200, 3
    lin = bnb.nn.Linear4bit(
        cols,
        rows,
        bias=False,
        compute_dtype=torch.float32,
        compress_statistics=double_quant,
        quant_type="nf4",
    )
    w = torch.randn(rows, cols, dtype=torch.bfloat16)
    lin.weight = bnb.nn.Params4bit(
        w, requires_grad=False, quant_type="nf4", compress_statistics=double_quant, module=lin
    ).to("cpu")
    x = torch.randn(tokens, cols, requires_grad=True)
    mode = _track([lin], [lin.weight])
    with mode:
        y = lin(x)
        assert y.grad_fn.saved_tensors == ()
        kept = y.grad_fn.tensors
        assert kept[0] is None and kept[1].data_ptr() == lin.weight.data_ptr()  # packed weight
        y.backward(torch.ones_like(y))
        del y, kept
    made = {(dt, shape) for _, dt, shape in mode.seen}
    assert (torch.float32, (rows, cols)) in made and (torch.bfloat16, (rows, cols)) in made
    assert ((torch.float32, (-(-rows * cols // 64),)) in made) == double_quant
    assert mode.peak == dequant_weight_bytes(rows * cols, 4, double_quant=double_quant, dtype_16=2)


@pytest.mark.parametrize("load", ["nf4-dq", "fp4"])
def test_model_dequant_transient_on_cpu(load):
    """A training forward and backward of the loaded tiny Llama (bf16 compute and weights).
    Equal without double quantization; with it the CUDA fallback keeps one more fp32 absmax
    vector (``absmax_dq`` beside ``absmax_dq + offset``) than the CPU path, which adds them in
    one expression: 4 bytes per block of the largest weight."""
    model, spec = _load("llama", load)
    model.train()
    linears = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    mode = _track(linears, list(model.parameters()))
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
    with mode:
        model(inputs_embeds=embeds, labels=ids, use_cache=False).loss.backward()
    dq = _options(load)["double_quant"]
    ours = dequant_transient_bytes(spec, _options(load)["quant"], 2, double_quant=dq)
    largest = max(m.out_features * m.in_features for m in linears)
    assert ours - mode.peak == (4 * -(-largest // 64) if dq else 0)


# ---------------------------------------------------------------------------- optimizers
NUMELS = [4095, 4096, 64 * 64, 100 * 300, 257, 1000 * 257, 300 * 400]
OPTIMS = {
    "adamw8bit": bnb.optim.AdamW8bit,
    "paged_adamw8bit": bnb.optim.PagedAdamW8bit,
    "paged_adamw": bnb.optim.PagedAdamW,
    "adamw": bnb.optim.AdamW,
}


def _state_bytes(opt, params) -> int:
    seen = {}
    for p in params:
        for v in opt.state[p].values():
            if torch.is_tensor(v):
                key = v.untyped_storage().data_ptr() if v.device.type != "meta" else id(v)
                seen[key] = _nbytes(v)
    return sum(seen.values())


@pytest.mark.parametrize("optim", list(OPTIMS))
@pytest.mark.parametrize("min_8bit_size", [4096, 0, 10**6])
def test_bnb_optimizer_states_after_one_step_on_cpu(optim, min_8bit_size):
    params = [torch.nn.Parameter(torch.randn(n)) for n in NUMELS]
    opt = OPTIMS[optim](params, lr=1e-3, min_8bit_size=min_8bit_size)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    assert all(isinstance(opt.state[p]["step"], int) for p in params)
    assert _state_bytes(opt, params) == bnb_optimizer_state_bytes(NUMELS, optim, min_8bit_size)


@pytest.mark.parametrize("optim", list(OPTIMS))
def test_paged_states_come_from_get_paged(optim, monkeypatch):
    """init_state on the meta device (not CPU, where bitsandbytes falls back to ordinary
    tensors), F.get_paged recorded instead of cudaMallocManaged."""
    paged = []

    def get_paged(*shape, dtype=torch.float32, device=None):
        t = torch.empty(shape, dtype=dtype, device="meta")
        paged.append(t)
        return t

    monkeypatch.setattr(bnb.optim.optimizer.F, "get_paged", get_paged)
    monkeypatch.setattr(bnb.optim.optimizer.F, "fill", lambda *a, **k: None)
    params = [torch.nn.Parameter(torch.empty(n, device="meta")) for n in NUMELS]
    opt = OPTIMS[optim](params, lr=1e-3)
    group = opt.param_groups[0]
    for i, p in enumerate(params):
        opt.init_state(group, p, 0, i)
    assert sum(map(_nbytes, paged)) == bnb_paged_state_bytes(NUMELS, optim)
    assert _state_bytes(opt, params) == bnb_optimizer_state_bytes(NUMELS, optim)


GALORE = [(64, 32), (32, 64), (50, 50), (10, 3), (3, 10)]


def _galore_step(shapes, rank, proj_type, dtype, other=(17, 4096)) -> int:
    """Bytes GaLoreAdamW holds after one step: moments and projection matrices."""
    torch.manual_seed(0)
    galore = [torch.nn.Parameter(torch.randn(s, dtype=dtype)) for s in shapes]
    rest = [torch.nn.Parameter(torch.randn(n, dtype=dtype)) for n in other]
    groups = [
        {"params": rest},
        {
            "params": galore,
            "rank": rank,
            "update_proj_gap": 200,
            "scale": 0.25,
            "proj_type": proj_type,
        },
    ]
    opt = galore_torch.GaLoreAdamW(groups, lr=1e-3, no_deprecation_warning=True)
    for p in galore + rest:
        p.grad = torch.randn_like(p)
    opt.step()
    held = 0
    for p in galore + rest:
        state = opt.state[p]
        held += _nbytes(state["exp_avg"]) + _nbytes(state["exp_avg_sq"])
        if "projector" in state:
            ortho = state["projector"].ortho_matrix
            held += sum(map(_nbytes, ortho if isinstance(ortho, list) else [ortho]))
    return held


@pytest.mark.parametrize("proj_type", ["std", "reverse_std", "right", "left", "full"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_galore_states_after_one_step_on_cpu(proj_type, dtype):
    """Rank 8 of shapes taller, wider, square and narrower than the rank (then min(m, n))."""
    shapes = GALORE if proj_type != "reverse_std" else GALORE[:-1]  # see the test below
    ours = galore_state_bytes(
        shapes, 8, other_numels=[17, 4096], itemsize=dtype.itemsize, proj_type=proj_type
    )
    assert ours == _galore_step(shapes, 8, proj_type, dtype)


def test_galore_reverse_std_refused_where_galore_torch_fails():
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        _galore_step([(3, 10)], 8, "reverse_std", torch.float32)
    with pytest.raises(ValueError, match="reverse_std"):
        galore_state_bytes([(3, 10)], 8, proj_type="reverse_std")
    assert galore_state_bytes([(3, 10)], 2, proj_type="reverse_std") == _galore_step(
        [(3, 10)], 2, "reverse_std", torch.float32, other=()
    )


# ---------------------------------------------------------------------------- bad input
LLAMA = ModelSpec.from_hf_config({"model_type": "llama", "num_hidden_layers": 2})


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: weight_bytes_4bit(0), "n_elements"),
        (lambda: weight_bytes_4bit(True), "n_elements"),
        (lambda: weight_bytes_4bit(64.0), "n_elements"),
        (lambda: weight_bytes_4bit(64, "int4"), "quant_type"),
        (lambda: weight_bytes_4bit(64, blocksize=48), "blocksize"),
        (lambda: weight_bytes_4bit(64, blocksize=64.0), "blocksize"),
        (lambda: weight_bytes_4bit(64, double_quant="yes"), "double_quant"),
        (lambda: weight_bytes_4bit(64, storage="bf16"), "storage"),
        (lambda: weight_bytes_4bit(6, storage="bfloat16"), "multiple of 2"),
        (lambda: weight_bytes_int8(0, 4), "rows"),
        (lambda: model_weight_bytes("llama"), "spec"),
        (lambda: model_weight_bytes(LLAMA, quant="q4"), "quant"),
        (lambda: model_weight_bytes(LLAMA, dtype_16=3), "dtype_16"),
        (lambda: model_weight_bytes(LLAMA, dtype_16=True), "dtype_16"),
        (lambda: model_weight_bytes(LLAMA.with_(family="internlm2")), "family"),
        (lambda: layer_weight_bytes(LLAMA, 2), "layer"),
        (lambda: layer_weight_bytes(LLAMA, -1), "layer"),
        (lambda: outer_weight_bytes(LLAMA, "middle"), "place"),
        (lambda: dequant_transient_bytes(LLAMA, "int8"), "int8"),
        (lambda: dequant_transient_bytes(LLAMA, compute_itemsize=1), "compute_itemsize"),
        (lambda: dequant_weight_bytes(0), "n_elements"),
        (lambda: bnb_optimizer_state_bytes("abc"), "shapes"),
        (lambda: bnb_optimizer_state_bytes([0]), r"shapes\[0\]"),
        (lambda: bnb_optimizer_state_bytes([10], "adam"), "optim"),
        (lambda: bnb_optimizer_state_bytes([10], min_8bit_size=-1), "min_8bit_size"),
        (lambda: bnb_paged_state_bytes([1.5]), r"shapes\[0\]"),
        (lambda: galore_state_bytes([(3,)], 4), "2-D"),
        (lambda: galore_state_bytes([(3, 4)], 0), "rank"),
        (lambda: galore_state_bytes([(3, 4)], 2, proj_type="svd"), "proj_type"),
        (lambda: galore_state_bytes([(3, 4)], 2, itemsize=8), "itemsize"),
        (lambda: galore_state_bytes([(3, 4)], 2, other_numels=[0]), "other_numels"),
        (lambda: galore_state_bytes("ab", 2), "shapes"),
    ],
)
def test_bad_input_is_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_unquantized_model_is_its_16_bit_parameters():
    assert model_weight_bytes(LLAMA, quant="none").total == 2 * LLAMA.num_params()
    assert model_weight_bytes(LLAMA, quant="none", dtype_16=4).kept == 4 * LLAMA.num_params()
    assert dequant_transient_bytes(LLAMA, "none") == 0
