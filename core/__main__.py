"""The ``ember`` command line (also ``python -m ember``).

    ember import model.onnx -o OUTDIR [--name NAME] [--shape input=1,3,224,224] [--quiet]
    ember chat model.gguf [--device D] [--prompt TEXT] [--system TEXT] [--max-tokens N] [--temperature T]
    ember serve --device webgpu|numpy|wasm [--host 127.0.0.1] [--port 8765] --token-file FILE

writes ``OUTDIR/model.py`` (a readable ember ``nn.Module``, its class named after the model file)
and ``OUTDIR/model.safetensors``; ``--name NAME`` writes ``OUTDIR/NAME.py`` and
``OUTDIR/NAME.safetensors`` with a class named after NAME.
"""
from __future__ import annotations

import argparse
import os
import sys


def _shape(text: str):
    name, sep, dims = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--shape wants NAME=D1,D2,..., got {text!r}")
    try:
        return name, tuple(int(d) for d in dims.replace("x", ",").split(",") if d)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: dimensions must be integers") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="ember", description="ember command line")
    sub = ap.add_subparsers(dest="cmd", required=True)
    imp = sub.add_parser("import", help="turn an ONNX model into an ember nn.Module + safetensors weights")
    imp.add_argument("model", help="path of the .onnx file")
    imp.add_argument("-o", "--out", required=True, help="output folder")
    imp.add_argument("--name", help="module and class name (default: files out/model.py and out/model.safetensors, class named after the model file)")
    imp.add_argument("--shape", action="append", type=_shape, default=[],
                     help="fix an input's shape, e.g. --shape image=1,3,224,224 (repeatable)")
    imp.add_argument("--quiet", action="store_true", help="no progress bar")
    ch = sub.add_parser("chat", help="chat with a GGUF language model in the terminal (streams tokens, prints tokens/s)")
    ch.add_argument("model", help="path of the .gguf file")
    ch.add_argument("--device", default=None, help="python | numpy | wasm | webgpu (default: numpy where installed, else python)")
    ch.add_argument("--prompt", help="one message to answer, then exit (default: read messages from stdin, one per line)")
    ch.add_argument("--system", help="a system prompt")
    ch.add_argument("--raw", action="store_true", help="continue the text as it is, without the chat template")
    ch.add_argument("--max-tokens", type=int, default=256)
    ch.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ch.add_argument("--top-k", type=int, default=None)
    ch.add_argument("--top-p", type=float, default=1.0)
    ch.add_argument("--min-p", type=float, default=0.0)
    ch.add_argument("--repetition-penalty", type=float, default=1.0)
    ch.add_argument("--seed", type=int, default=None)
    ch.add_argument("--context", type=int, default=None, help="positions of the key/value cache")
    sv = sub.add_parser("serve", help="serve a device to ember.remote clients over WebSocket (loopback by default)")
    sv.add_argument("--device", default="numpy", help="webgpu | numpy | wasm | python (default numpy)")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    sv.add_argument("--port", type=int, default=8765, help="port (0: a free one, printed on stdout)")
    sv.add_argument("--token-file", required=True, help="file holding the token clients must send")
    sv.add_argument("--ssl-certfile", help="TLS certificate (PEM): serve wss://")
    sv.add_argument("--ssl-keyfile", help="TLS private key (PEM)")
    sv.add_argument("--max-connection-bytes", type=int, default=None, help="memory ceiling per connection")
    sv.add_argument("--max-total-bytes", type=int, default=None, help="memory ceiling of the whole server")
    sv.add_argument("--max-message", type=int, default=None, help="largest frame accepted, in bytes")
    sv.add_argument("--idle-seconds", type=float, default=None, help="close a connection idle this long")
    sv.add_argument("--max-queue", type=int, default=None, help="requests waiting at most; more are refused as busy")
    args = ap.parse_args(argv)

    if args.cmd == "serve":
        return _serve(args)
    if args.cmd == "chat":
        return _chat(args)
    if args.cmd == "import":
        from .errors import EmberError
        from .onnx.codegen import generate

        try:
            stem = os.path.splitext(os.path.basename(str(args.model)))[0] or "model"
            r = generate(args.model, args.out, name=args.name or "model", input_shapes=dict(args.shape),
                         progress=not args.quiet, class_name=args.name or stem)
        except EmberError as e:
            print(f"ember import: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        print(f"wrote {r['module']} (class {r['class']}, {r['nodes']} lines) and {r['weights']}")
        if r["generic"] and not args.shape:
            print(f"ember import: {r['generic']} line(s) read sizes at run time because the model's input "
                  f"shapes are symbolic; --shape NAME=D1,D2,... gives fixed, plainer code", file=sys.stderr)
        return 0
    return 2


def _serve(args) -> int:
    from .errors import EmberError
    from .remote.server import Limits, serve

    lim = Limits()
    for key in ("max_connection_bytes", "max_total_bytes", "max_message", "idle_seconds", "max_queue"):
        if getattr(args, key) is not None:
            setattr(lim, key, getattr(args, key))
    try:
        serve(args.device, args.host, args.port, args.token_file, limits=lim, ssl_certfile=args.ssl_certfile,
              ssl_keyfile=args.ssl_keyfile)
    except (EmberError, OSError, ValueError) as e:
        print(f"ember serve: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def _chat(args) -> int:
    import time

    from .errors import EmberError

    dev = args.device
    if dev is None:
        from .backends import devices
        dev = "numpy" if "numpy" in devices() else "python"
    try:
        from . import llm

        size = os.path.getsize(args.model) if os.path.exists(args.model) else 0
        print(f"ember chat: loading {args.model} ({size / 1e6:.0f} MB) on {dev}...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        model = llm.load(args.model, device=dev, context=args.context)
        print(f"ember chat: loaded in {time.perf_counter() - t0:.1f} s ({model.model.cfg.n_layers} layers, "
              f"context {model.context}); empty line or Ctrl+D ends", file=sys.stderr, flush=True)
        opts = dict(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                    min_p=args.min_p, repetition_penalty=args.repetition_penalty, seed=args.seed, stream=True)
        history = [{"role": "system", "content": args.system}] if args.system else []
        while True:
            if args.prompt is not None:
                text = args.prompt
            else:
                try:
                    text = input("> ")
                except EOFError:
                    break
                if not text.strip():
                    break
            if args.raw:
                pieces = model.generate(text, **opts)
            else:
                history.append({"role": "user", "content": text})
                pieces = model.chat(history, **opts)
            reply = []
            for piece in pieces:
                reply.append(piece)
                print(piece, end="", flush=True)
            print()
            s = model.stats
            print(f"[prompt {s['prompt_tokens']} tokens, {s['prompt_tokens_per_second']:.1f} tok/s; "
                  f"decode {s['tokens']} tokens, {s['decode_tokens_per_second']:.1f} tok/s; {s['device']}]",
                  file=sys.stderr, flush=True)
            if not args.raw:
                history.append({"role": "assistant", "content": "".join(reply)})
            if args.prompt is not None:
                break
    except EmberError as e:
        print(f"ember chat: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except (OSError, KeyboardInterrupt) as e:
        print(f"ember chat: {e or 'interrupted'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
