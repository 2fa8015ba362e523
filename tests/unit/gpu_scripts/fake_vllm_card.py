"""A stand-in for `vllm serve` where no GPU exists (test_card_fit.py): from the arguments the launch script passes
and a pretend device (FAKE_* variables) it prints what vLLM 0.21.0 prints at engine start, in its format strings
(vllm/v1/worker/gpu_model_runner.py, gpu_worker.py, vllm/v1/core/kv_cache_utils.py), then either exits 1 with
vLLM's error or answers /health until SIGINT. Each call appends its argv to FAKE_CALLS (one JSON line)."""

from __future__ import annotations

import http.server
import json
import os
import sys

GIB = 1 << 30


def arg(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def gib(b: float) -> str:
    return f"{round(b / GIB, 2)}"  # vLLM's format_gib


def say(where: str, text: str) -> None:
    print(f"(EngineCore pid=4242) INFO 11-29 01:00:00 [{where}] {text}", flush=True)


def fail(text: str) -> None:
    print(f"(EngineCore pid=4242) ERROR 11-29 01:00:01 [core.py:1140] ValueError: {text}", flush=True)
    print("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
          flush=True)
    sys.exit(1)


def main() -> None:
    argv = sys.argv[1:]
    with open(os.environ["FAKE_CALLS"], "a") as f:
        f.write(json.dumps(argv) + "\n")
    context, seqs = int(arg(argv, "--max-model-len")), int(arg(argv, "--max-num-seqs"))
    budget = float(arg(argv, "--gpu-memory-utilization")) * float(os.environ["FAKE_TOTAL_GIB"]) * GIB
    weights = float(os.environ["FAKE_WEIGHTS_GIB"]) * GIB
    overhead = (1.0 + 0.05 * seqs) * GIB  # activations grow with the batch
    per_token = float(os.environ["FAKE_KV_BYTES_PER_TOKEN"])
    say("gpu_model_runner.py:4960", f"Model loading took {gib(weights)} GiB memory and 12.345678 seconds")
    available = budget - weights - overhead
    say("gpu_model_runner.py:6145", "Estimated CUDA graph memory: 0.42 GiB total")
    if os.environ.get("VLLM_LOGGING_LEVEL") == "DEBUG":  # vLLM logs its profile result at DEBUG only
        say("gpu_worker.py:461", f"Memory profiling takes 3.21 seconds. Total non KV cache memory: "
            f"{gib(weights + overhead)}GiB; torch peak memory increase: {gib(overhead - 0.25 * GIB)}GiB; "
            f"non-torch forward increase memory: 0.25GiB; weights memory: {gib(weights)}GiB.")
    say("gpu_worker.py:463", f"Available KV cache memory: {gib(available)} GiB")  # logged before the check
    if available <= 0:
        fail("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
             "initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ "
             "for more details.")
    needed = context * per_token
    if needed > available:
        longest = int(available // per_token)
        estimate = ("" if os.environ.get("FAKE_NO_ESTIMATE") else
                    f"Based on the available memory, the estimated maximum model length is {longest}. ")
        fail(f"To serve at least one request with the models's max seq len ({context}), ({gib(needed)} GiB KV "
             f"cache is needed, which is larger than the available KV cache memory ({gib(available)} GiB). "
             f"{estimate}Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing "
             "the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")
    tokens = int(available // per_token)
    say("kv_cache_utils.py:1710", f"GPU KV cache size: {tokens:,} tokens")
    say("kv_cache_utils.py:1712", f"Maximum concurrency for {context:,} tokens per request: {tokens / context:.2f}x")

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", int(arg(argv, "--port"))), Health)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        server.server_close()


if __name__ == "__main__":
    main()
