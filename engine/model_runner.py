"""The only module that touches torch devices: weights, the KV pool, one forward per step.

On CUDA (docs/gpu.md): attention runs the Triton kernel over the pool in place, host
inputs travel through pinned memory, the KV pool is sized from free device memory, and
pure decode steps replay CUDA graphs captured per batch-size bucket (prefill runs eagerly).
Steps that hold a deterministic request run eagerly, their row-wise work on the fixed
sizes of engine/model/invariant.py and attention with the kernel's invariant tiles.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import math
import os
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import cast

import torch

from engine.config import EngineConfig, ModelConfig
from engine.errors import ConfigError
from engine.grammar import Grammars
from engine.model.attention import AttentionMetadata, ChunkKeys, DecodeKeys, PagedLaunch, PrefillSpan, build_mask
from engine.model.invariant import ROW_SIZES, ROW_TILE, key_length, rows_are_invariant, tile_mask
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import load_weights
from engine.model.quant import DENSE_MIN_ROWS, QUANTIZED_FILE
from engine.paths import default_cache_dir
from engine.sampler import Sampler, SampleResult
from engine.scheduler import ScheduledBatch

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but no CUDA device is available")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    # bfloat16 matmuls are 3-3.6x faster than float32 where the CPU has bf16 instructions,
    # and emulated (two orders of magnitude slower) where it has not.
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


# The CPU flags (x86: /proc/cpuinfo "flags"; Arm: "Features") that mean bf16 dot products in hardware.
_BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


@functools.cache
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU reports bf16 instructions; False where it does not say (macOS, no /proc)."""
    try:
        text = Path(cpuinfo).read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return not _BF16_CPU_FLAGS.isdisjoint(value.split())
    return False


def available_cpus(proc: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int:
    """The CPUs this process can keep busy: its affinity mask, capped by its cgroup's CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpu_quota(proc, root)
    if quota is not None:
        cpus = min(cpus, max(1, math.floor(quota)))  # a thread past the quota only gets throttled
    return max(1, cpus)


def _cgroup_cpu_quota(proc: str, root: str) -> float | None:
    """CPUs' worth of quota of this process's cgroup and its ancestors (v2 cpu.max, v1 cfs); None: no limit."""
    try:
        lines = Path(proc).read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        files: tuple[str, ...]
        if controllers == "":  # cgroup v2
            base, files = Path(root), ("cpu.max",)
        elif "cpu" in controllers.split(","):  # cgroup v1
            base, files = Path(root) / controllers, ("cpu.cfs_quota_us", "cpu.cfs_period_us")
            if not base.is_dir():
                base = Path(root) / "cpu"
        else:
            continue
        parts = Path(path.strip() or "/").parts[1:]
        for depth in range(len(parts), -1, -1):
            folder = base.joinpath(*parts[:depth])
            try:
                texts = [(folder / f).read_text().split() for f in files]
            except OSError:
                continue
            quota, period = (texts[0] if len(files) == 1 else (texts[0][0], texts[1][0]))
            if quota not in ("max", "-1") and float(period) > 0:
                limits.append(float(quota) / float(period))
    return min(limits) if limits else None


def choose_cpu_threads(requested: int | None) -> int:
    """The model's CPU threads: the setting, else OMP_NUM_THREADS as torch read it, else available_cpus()."""
    if requested is not None:
        return requested
    if os.environ.get("OMP_NUM_THREADS") or os.environ.get("TORCH_NUM_THREADS"):
        return torch.get_num_threads()
    return available_cpus()


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def _libc() -> ctypes.CDLL | None:
    """The C library, where it can be loaded; its glibc-only functions may still be missing."""
    path = ctypes.util.find_library("c")
    try:
        return None if path is None else ctypes.CDLL(path)
    except OSError:
        return None


def keep_cpu_memory_mapped() -> bool:
    """Stop glibc from handing large freed buffers back to the kernel after every op.

    Each step allocates and frees activation and KV-gather buffers of megabytes. By
    default glibc serves those with fresh mmaps (or trims them off the heap), so every
    step page-faults them in again: in a VM that made the KV gather ten times slower
    than the copy itself. Keeping them in the heap is what jemalloc/tcmalloc would do.
    """
    libc = _libc()
    if libc is None:
        return False
    try:
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20) == 1
        return libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1 and ok
    except AttributeError:  # not glibc (musl, macOS): nothing to tune
        return False


def return_freed_memory() -> None:
    """Hand the heap's free pages back to the kernel once, after loading (glibc's malloc_trim).

    keep_cpu_memory_mapped stops glibc from trimming after each free, so what loading freed (the
    tokenizer's parse of its JSON, the load's buffers: tens of MiB) would stay resident for the
    process's life; the steps' own buffers are allocated again at the first step and kept."""
    libc = _libc()
    if libc is None:
        return
    try:
        libc.malloc_trim(0)
    except AttributeError:  # not glibc: nothing to do
        pass


def kv_bytes_per_block(model_config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    per_token = 2 * model_config.num_hidden_layers * model_config.num_key_value_heads * model_config.head_dim
    return per_token * block_size * torch.empty((), dtype=dtype).element_size()


# CPU steps of at most this many tokens (a few sequences' decode) run torch's own ops on one thread
# (quantized weights only): docs/engine.md, "Threads". 64 halved a quiet machine's mixed steps.
SERIAL_STEP_TOKENS = 4


def graph_batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """The batch sizes decode CUDA graphs are captured for; a step replays the smallest that holds it."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_num_seqs] + list(range(16, max_num_seqs, 16))
    return tuple(sizes) + (max_num_seqs,)


def start_quantized_kernels(config: EngineConfig) -> None:
    """Start building (or loading) the quantized kernels on a thread where the runner will ask for
    them: weights not "dequantized", on CPU, for a GGUF model. The build, seconds of g++ on a first
    start, then runs while the GGUF file is converted; the runner's kernels.load waits for it."""
    if config.weights == "dequantized" or resolve_device(config.device).type != "cpu":
        return
    from engine.model import kernels
    from engine.model.catalog import names_gguf

    if names_gguf(config.model):
        kernels.load_in_background(default_cache_dir())


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        config: EngineConfig,
        model_path: Path,
        max_model_len: int,
        num_blocks: int | None,  # None: as many as free device memory allows (CUDA)
        progress: bool = False,
        grammars: Grammars | None = None,
        before_kernels: Callable[[], None] | None = None,
    ) -> None:
        # before_kernels: work of the caller's that can run while a first start's kernel build finishes.
        self.grammars = grammars  # fills the grammar masks of structured outputs; None: none are asked for
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self._cuda = self.device.type == "cuda"  # pinned transfers, CUDA graphs
        # Attention by the Triton kernel over the pool in place (tests turn it on for CPU tensors
        # under Triton's interpreter).
        self.paged_kernel = self._cuda
        self._config = config
        self._max_model_len = max_model_len
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        if self._cuda:
            torch.cuda.set_device(self.device)  # graphs capture on the current device
        if self.device.type == "cpu":
            if not keep_cpu_memory_mapped():
                logger.info("could not tune the C allocator; CPU steps may page-fault their buffers")
            self.threads = choose_cpu_threads(config.threads)
            if self.threads != torch.get_num_threads():
                torch.set_num_threads(self.threads)
            logger.info("CPU threads: %d (%d CPUs available to this process)", self.threads, available_cpus())
        else:
            self.threads = 1
        self.block_size = config.block_size
        self.sliding_window = model_config.sliding_window
        self._group = model_config.num_attention_heads // model_config.num_key_value_heads
        self._max_num_seqs = config.max_num_seqs
        self._row_sizes: tuple[int, ...] | None = None  # of the invariant path, chosen at its first step
        self._logit_row_sizes: tuple[int, ...] | None = None
        prev_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                self.model = LlamaForCausalLM(model_config, max_positions=max_model_len)
        finally:
            torch.set_default_dtype(prev_dtype)
        self.model.eval()
        # A pool of known size is allocated first: on a first start that happens while the quantized
        # kernels still build on their thread (start_quantized_kernels), which the next line waits for.
        scratch = 1 if self._cuda else 0  # on CUDA one scratch block past the pool (below)
        kv_caches = None if num_blocks is None else self._allocate_kv(model_config, num_blocks + scratch)
        if before_kernels is not None:
            before_kernels()
        kernels = self._quantized_kernels(config.weights, model_path)
        # "dequantized", or the kernels' instruction set: it decides the order of their sums.
        self.weights = "dequantized" if kernels is None else f"quantized-{kernels.isa_name}"
        self._serial_small_steps = kernels is not None and self.threads > 1
        load_weights(self.model, model_path, progress=progress, isa=None if kernels is None else kernels.isa,
                     threads=self.threads)
        if num_blocks is None:
            num_blocks = self._blocks_from_free_memory(model_config)
        self.num_blocks = num_blocks
        # On CUDA one scratch block past the pool takes the K/V of a captured graph's padded rows.
        self._scratch_slot = num_blocks * config.block_size
        self.kv_caches = kv_caches if kv_caches is not None else self._allocate_kv(model_config, num_blocks + scratch)
        self.sampler = Sampler(config.seed)

    def _quantized_kernels(self, mode: str, model_path: Path):
        """The kernels that serve packed weights in place, or None: dense weights in the dtype."""
        if mode == "dequantized":
            return None
        from engine.model import kernels

        why = None
        if self.device.type != "cpu":
            why = f"the quantized kernels run on CPU only, not {self.device.type}"
        elif not (model_path / QUANTIZED_FILE).is_file():
            why = f"{model_path.name} holds no packed weights (only GGUF checkpoints do)"
        else:
            loaded = kernels.load(default_cache_dir())
            if loaded is not None:
                return loaded
            why = "the quantized kernels could not be built here (see the warning above)"
        if mode == "quantized":
            raise ConfigError(f"weights 'quantized' cannot be served: {why}")
        logger.info("serving dequantized weights: %s", why)
        return None

    def _allocate_kv(self, model_config: ModelConfig, num_blocks: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (num_blocks, self.block_size, model_config.num_key_value_heads, model_config.head_dim)
        return [
            (torch.zeros(shape, dtype=self.dtype, device=self.device),
             torch.zeros(shape, dtype=self.dtype, device=self.device))
            for _ in range(model_config.num_hidden_layers)
        ]

    def _blocks_from_free_memory(self, model_config: ModelConfig) -> int:
        """KV blocks that fit in gpu_memory_utilization of the device, beside the weights and the
        activation peak of a warm-up step of max_num_batched_tokens (as nano-vllm sizes its pool)."""
        if not self._cuda:
            raise ConfigError("the KV pool is sized from free memory only on CUDA; set kv_cache_memory_bytes")
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self._warm_up(model_config)
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        stats = torch.cuda.memory_stats(self.device)
        activations = stats["allocated_bytes.all.peak"] - stats["allocated_bytes.all.current"]
        utilization = cast(float, self._config.gpu_memory_utilization)  # set: LLMEngine sizes the pool from it
        budget = int(total * utilization) - (total - free) - activations
        block_bytes = kv_bytes_per_block(model_config, self.block_size, self.dtype)
        num_blocks = budget // block_bytes - 1  # less the scratch block
        if num_blocks < 1:
            raise ConfigError(
                f"no device memory left for the KV cache: {total - free} of {total} bytes in use after loading, "
                f"{activations} more for activations; raise gpu_memory_utilization "
                f"({self._config.gpu_memory_utilization})"
            )
        logger.info("KV pool: %d blocks (%d MiB) from free device memory", num_blocks, num_blocks * block_bytes >> 20)
        return num_blocks

    @torch.inference_mode()
    def _warm_up(self, model_config: ModelConfig) -> None:
        """The largest step: max_num_batched_tokens of prompt, in sequences of at most max_model_len,
        through the kernel over a pool of their own, and logits for max_num_seqs rows."""
        tokens, longest, bs = self._config.max_num_batched_tokens, self._max_model_len, self.block_size
        lengths = [min(longest, tokens - start) for start in range(0, tokens, longest)]
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        tables: list[list[int]] = []
        slots: list[int] = []
        positions: list[int] = []
        first_block = 0
        for n in lengths:
            table = list(range(first_block, first_block + -(-n // bs)))
            first_block += len(table)
            tables.append(table)
            slots += [table[p // bs] * bs + p % bs for p in range(n)]
            positions += range(n)
        caches = self._allocate_kv(model_config, first_block)
        launch = self._launch(starts, lengths, lengths, tables)
        meta = AttentionMetadata(self._tensor(slots), None, None, None, [], paged=[launch])
        ids = torch.zeros(tokens, dtype=torch.long, device=self.device)
        hidden = self.model(ids, self._tensor(positions), meta, caches)
        self.model.compute_logits(hidden[: self._max_num_seqs])

    def _start_masks(self, seqs: list) -> tuple[list[int], Future] | None:
        """The grammar masks of the constrained rows among seqs, filled on llguidance's threads while
        the model runs (it releases the GIL); None when no row is constrained."""
        constrained = [i for i, s in enumerate(seqs) if s.grammar is not None]
        if not constrained:
            return None
        grammars = cast("Grammars", self.grammars)  # a row with a grammar: the engine was given grammars
        return constrained, grammars.bitmask_async([seqs[i].grammar for i in constrained])

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> list[SampleResult | None]:
        """Run one step; returns, per scheduled sequence, its new token or None (mid-prefill)."""
        if self._serial_small_steps:
            # A decode step: torch's own ops (norms, attention, copies, small matmuls) gain little from
            # threads, and each of their parallel regions waits at a barrier for every thread, so one
            # thread that loses its core to another process stalls the step (measured: docs/engine.md).
            # The quantized kernels keep self.threads, without a barrier. Not on the deterministic path,
            # whose dense kernels were checked at one thread count.
            serial = batch.num_tokens <= SERIAL_STEP_TOKENS and not batch.deterministic
            torch.set_num_threads(1 if serial else self.threads)
        if self._replays(batch):
            hidden, meta, sample_rows, sampling = self._replay_decode(batch)  # the device runs on meanwhile
            seqs = [batch.seqs[i] for i in sampling]
            pending = self._start_masks(seqs)
        else:
            input_ids, positions, meta, sample_rows, sampling = self._prepare(batch)
            seqs = [batch.seqs[i] for i in sampling]
            pending = self._start_masks(seqs)
            hidden = self.model(input_ids, positions, meta, self.kv_caches)
        results: list[SampleResult | None] = [None] * len(batch.seqs)
        if sample_rows:
            rows = hidden[self._tensor(sample_rows)]
            logits = self.model.compute_logits(rows, self._logit_row_sizes if meta.row_sizes else None)
            if len(sample_rows) > len(seqs):  # a sequence verifies a draft: its rows come last (_prepare)
                width = 1 + len(seqs[-1].draft_token_ids)
                logits, verify = logits[:-width], logits[-width:]
                seqs, drafting = seqs[:-1], seqs[-1]
                results[sampling.pop()] = self.sampler.verify(verify, drafting.draft_token_ids, drafting.seq_id,
                                                              drafting.params)
            if seqs:
                outputs = [s.output_token_ids if s.params.penalized else [] for s in seqs]
                masks = (pending[0], pending[1].result()) if pending is not None else None
                samples = self.sampler.sample(logits, [s.seq_id for s in seqs], [s.params for s in seqs], outputs,
                                              masks)
                for i, sample in zip(sampling, samples):
                    results[i] = sample
        return results

    def invariant_row_sizes(self) -> tuple[int, ...]:
        """The row counts the invariant path calls row-wise work with: ROW_SIZES if this model's kernels
        give a row the same bits in all of them, else those that quantized weights run on the dense
        matmul (small calls take a kernel that sums in another order), else the fixed ROW_TILE, which
        needs no such check."""
        if self._row_sizes is None:
            hidden = self.model.config.hidden_size
            self._row_sizes, self._logit_row_sizes = (ROW_TILE,), (ROW_TILE,)
            dense_sizes = tuple(s for s in ROW_SIZES if s >= DENSE_MIN_ROWS)
            with torch.inference_mode():
                for sizes in (ROW_SIZES, dense_sizes):
                    # Logits are taken for at most one row per sequence: check the lm_head (the widest
                    # matmul) only up to the first size that holds max_num_seqs rows.
                    cut = next((i + 1 for i, s in enumerate(sizes) if s >= self._max_num_seqs), None)
                    logit_sizes = sizes[:cut]
                    if (rows_are_invariant(self.model.row_functions(), sizes, self.dtype, self.device)
                            and rows_are_invariant([(self.model.lm_head, hidden)], logit_sizes, self.dtype,
                                                   self.device)):
                        self._row_sizes, self._logit_row_sizes = sizes, logit_sizes
                        break
                else:
                    logger.warning("row-wise kernels are not invariant across call sizes here; "
                                   "the deterministic lane falls back to %d-row tiles", ROW_TILE)
        return self._row_sizes

    def release(self, seq_id: str) -> None:
        self.sampler.release(seq_id)

    # -- CUDA: pinned transfers, the Triton kernel's launches, decode graphs ---------------

    def _tensor(self, values, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A host list on the device; on CUDA through pinned memory, without waiting for the copy."""
        if not self._cuda:
            return torch.tensor(values, dtype=dtype, device=self.device)
        return torch.tensor(values, dtype=dtype, pin_memory=True).to(self.device, non_blocking=True)

    def _launch(self, q_start: list[int], q_len: list[int], context_lens: list[int],
                tables: list[list[int]]) -> PagedLaunch:
        width = max(-(-n // self.block_size) for n in context_lens)
        flat = [block for table, n in zip(tables, context_lens)
                for block in table[: -(-n // self.block_size)] + [0] * (width - -(-n // self.block_size))]
        # Rows padded to 16 bytes, so the kernel's arguments keep one alignment (no recompiles).
        pad = [0] * (-len(q_start) % 4)
        meta = self._tensor([q_start + pad, q_len + pad, context_lens + pad], torch.int32)[:, : len(q_start)]
        block_tables = self._tensor(flat, torch.int32).view(len(q_start), width)
        return PagedLaunch(meta[0], meta[1], meta[2], block_tables, max(q_len), self.sliding_window)

    def prepare_decode_graphs(self) -> None:
        """Capture one CUDA graph of the decoder per batch-size bucket (CUDA, unless enforce_eager).

        A graph replays fixed buffers: token ids, positions, slots, the kernel's per-row
        lengths and a block table as wide as max_model_len. Rows past a step's batch are
        padding: no new tokens (the kernel skips them) and their K/V go to the scratch block.
        """
        if not self._cuda or self._config.enforce_eager or self._graphs:
            return
        sizes = graph_batch_sizes(self._max_num_seqs)
        self._allocate_graph_inputs(sizes[-1])
        pool = None
        with torch.inference_mode():
            for size in reversed(sizes):  # the largest first, so the smaller ones reuse its memory
                forward = self.graph_forward(size)
                forward()  # compiles the kernel outside the capture
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool):
                    forward()
                pool = pool or graph.pool()
                self._graphs[size] = graph
                torch.cuda.synchronize(self.device)
        logger.info("captured decode CUDA graphs for batch sizes %s", ",".join(map(str, sizes)))

    def _allocate_graph_inputs(self, largest: int) -> None:
        dev = self.device
        longs = torch.zeros(3, largest, dtype=torch.long, device=dev)  # ids, positions, slots
        longs[2] = self._scratch_slot
        # first row, new tokens, context; rows of whole 16 bytes, as _launch pads them
        ints = torch.zeros(3, -(-largest // 4) * 4, dtype=torch.int32, device=dev)
        ints[0] = torch.arange(ints.shape[1], dtype=torch.int32, device=dev)
        tables = torch.zeros(largest, -(-self._max_model_len // self.block_size), dtype=torch.int32, device=dev)
        hidden = torch.zeros(largest, self.model.config.hidden_size, dtype=self.dtype, device=dev)
        self._graph_inputs = (longs, ints, tables, hidden)
        self._graph_sizes = graph_batch_sizes(largest)

    def graph_forward(self, size: int):
        """The decoder over the first `size` rows of the graph buffers (what a decode graph replays)."""
        longs, ints, tables, hidden = self._graph_inputs
        launch = PagedLaunch(ints[0, :size], ints[1, :size], ints[2, :size], tables[:size], 1, self.sliding_window)
        meta = AttentionMetadata(longs[2, :size], None, None, None, [], paged=[launch])

        def forward() -> None:
            hidden[:size] = self.model(longs[0, :size], longs[1, :size], meta, self.kv_caches)

        return forward

    def _replays(self, batch: ScheduledBatch) -> bool:
        return (bool(self._graphs) and not batch.deterministic and len(batch.seqs) <= self._graph_sizes[-1]
                and all(n == 1 for n in batch.num_new_tokens))

    def _replay_decode(self, batch: ScheduledBatch):
        n, bs = len(batch.seqs), self.block_size
        size = next(s for s in self._graph_sizes if s >= n)
        longs, ints, tables, hidden = self._graph_inputs
        pad = size - n
        positions = [seq.num_computed_tokens for seq in batch.seqs]
        ids = [seq.token_ids[p] for seq, p in zip(batch.seqs, positions)]
        slots = [seq.block_table[p // bs] * bs + p % bs for seq, p in zip(batch.seqs, positions)]
        host_longs = torch.tensor([ids + [0] * pad, positions + [0] * pad, slots + [self._scratch_slot] * pad],
                                  dtype=torch.long, pin_memory=self._cuda)
        host_ints = torch.tensor([[1] * n + [0] * pad, [p + 1 for p in positions] + [0] * pad],
                                 dtype=torch.int32, pin_memory=self._cuda)
        width = max(-(-(p + 1) // bs) for p in positions)
        flat = [b for seq in batch.seqs for b in seq.block_table[:width] + [0] * (width - len(seq.block_table[:width]))]
        host_tables = torch.tensor(flat, dtype=torch.int32, pin_memory=self._cuda).view(n, width)
        sampling = [i for i, (seq, p) in enumerate(zip(batch.seqs, positions)) if p + 1 == seq.num_tokens]
        sample_rows = list(sampling)
        longs[:, :size].copy_(host_longs, non_blocking=True)
        ints[1:, :size].copy_(host_ints, non_blocking=True)
        tables[:n, :width].copy_(host_tables, non_blocking=True)
        self._graphs[size].replay()
        meta = AttentionMetadata(longs[2, :size], None, None, None, [])
        return hidden[:size], meta, sample_rows, sampling

    def _prepare(self, batch: ScheduledBatch):
        bs, dev = self.block_size, self.device
        invariant = batch.deterministic  # the fixed-shape path of model/invariant.py
        paged = self.paged_kernel  # the Triton kernel reads the pool in place: no masks, no padding
        chunks: tuple[list[int], list[int], list[int], list[list[int]]] = ([], [], [], [])  # its prefill launch
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        decode_rows: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillSpan] = []
        sample_rows: list[int] = []
        sampling: list[int] = []
        drafting: tuple[int, range] | None = None
        for i, (seq, num_new) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new
            row = len(input_ids)
            table = seq.block_table
            draft = seq.draft_token_ids  # verified after the next token, one row each (engine/speculation.py)
            input_ids.extend(seq.token_ids[start:end] + draft if draft else seq.token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            if num_new == 1 or draft:
                # A draft's rows attend as decodes, each to the keys up to its own position (all of the
                # step's K/V is written before any is read): the kernel a one-token step runs, so each
                # row's attention is what decoding that token alone computes.
                for j in range(num_new):
                    decode_rows.append(row + j)
                    decode_tables.append(table)
                    decode_lens.append(start + j + 1)
            elif paged:
                for values, value in zip(chunks, (row, num_new, end, table)):
                    values.append(value)  # type: ignore[attr-defined]  # each list takes its own kind
            else:
                mask = None
                # (the invariant path builds its own masks)
                if not invariant and (start > 0 or (self.sliding_window is not None and end > self.sliding_window)):
                    mask = build_mask(torch.arange(start, end), torch.arange(end), self.sliding_window).to(dev)
                blocks = table[: -(-end // bs)]
                key_groups = None
                if invariant:  # blocks for the longest key length (the extra ones are masked)
                    blocks = blocks + [0] * (-(-key_length(end - 1) // bs) - len(blocks))
                    key_groups = self._chunk_keys(row, start, end)
                block_ids = torch.tensor(blocks, device=dev)
                prefills.append(PrefillSpan(row, row + num_new, end, block_ids, mask, key_groups))
            if draft:  # the next token's row and each draft token's, after every other sequence's row
                drafting = (i, range(row + num_new - 1 - len(draft), row + num_new))
            elif end == seq.num_tokens:
                sample_rows.append(row + num_new - 1)
                sampling.append(i)
        if drafting is not None:
            sampling.append(drafting[0])
            sample_rows.extend(drafting[1])

        meta = AttentionMetadata(
            slot_mapping=self._tensor(slots),
            decode_rows=None,
            decode_block_tables=None,
            decode_mask=None,
            prefills=prefills,
            row_sizes=self.invariant_row_sizes() if invariant else None,
        )
        if paged:
            meta.paged = []
            if decode_rows:
                meta.paged.append(self._launch(decode_rows, [1] * len(decode_rows), decode_lens, decode_tables))
            if chunks[0]:
                meta.paged.append(self._launch(*chunks))
            for launch in meta.paged:
                launch.invariant = invariant
        elif decode_rows and invariant:
            meta.decode_groups = self._decode_keys(decode_rows, decode_tables, decode_lens)
        elif decode_rows:
            max_blocks = max(-(-n // bs) for n in decode_lens)
            tables = torch.zeros(len(decode_rows), max_blocks, dtype=torch.long)
            for j, (table, n) in enumerate(zip(decode_tables, decode_lens)):
                used = -(-n // bs)
                tables[j, :used] = torch.tensor(table[:used])
            lengths = torch.tensor(decode_lens)
            key_pos = torch.arange(max_blocks * bs)[None, :]
            mask = key_pos < lengths[:, None]
            if self.sliding_window is not None:
                mask &= (lengths[:, None] - 1) - key_pos < self.sliding_window
            meta.decode_rows = torch.tensor(decode_rows, device=dev)
            meta.decode_block_tables = tables.to(dev)
            meta.decode_mask = mask[:, None, None, :].to(dev)
        return (
            self._tensor(input_ids),
            self._tensor(positions),
            meta,
            sample_rows,
            sampling,
        )

    def _tile_mask(self, positions: list[int] | range, num_keys: int) -> torch.Tensor:
        mask = tile_mask(torch.tensor(positions), self._group, num_keys, self.sliding_window, self.dtype)
        return mask.to(self.device)

    def _chunk_keys(self, row: int, start: int, end: int) -> list[ChunkKeys]:
        """The chunk of positions [start, end) at step rows from `row`, split where the key length changes."""
        groups = []
        first = start
        while first < end:
            num_keys = key_length(first)
            last = min(end, num_keys)
            mask = self._tile_mask(range(first, last), num_keys)
            groups.append(ChunkKeys(row + first - start, row + last - start, num_keys, mask))
            first = last
        return groups

    def _decode_keys(self, rows: list[int], tables: list[list[int]], lengths: list[int]) -> list[DecodeKeys]:
        """The decodes grouped by the key length of their position."""
        by_keys: dict[int, list[int]] = {}
        for j, n in enumerate(lengths):
            by_keys.setdefault(key_length(n - 1), []).append(j)
        groups = []
        for num_keys, members in sorted(by_keys.items()):
            num_blocks = -(-num_keys // self.block_size)
            block_tables = torch.zeros(len(members), num_blocks, dtype=torch.long)
            for i, j in enumerate(members):
                used = -(-lengths[j] // self.block_size)
                block_tables[i, :used] = torch.tensor(tables[j][:used])
            groups.append(DecodeKeys(
                torch.tensor([rows[j] for j in members], device=self.device),
                block_tables.to(self.device),
                num_keys,
                self._tile_mask([lengths[j] - 1 for j in members], num_keys),
            ))
        return groups
