"""Shared by the server tests: paths, free ports, starting and stopping servers."""
import gc
import os
import pathlib
import socket
import struct
import subprocess
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = ROOT / "target" / "release" / "axle"
MODEL_DIR = pathlib.Path(os.environ.get("AXLE_MODEL_DIR", pathlib.Path.home() / ".cache" / "axle" / "models"))
MODEL = MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(proc, url, tries=600):
    """Polls `url` until it answers; raises with the server's stderr if the process dies."""
    for _ in range(tries):
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                r.read()
            # An attempt that timed out while the server was starting may have left its socket
            # open in the exception's reference cycle, holding a connection slot of the server:
            # close such sockets now, not whenever the collector runs.
            gc.collect()
            return
        except Exception:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else "(see its log)"
                raise RuntimeError(f"server exited ({proc.returncode}): {err}")
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{url} did not come up")


def start_axle(*args, health="/health"):
    """Starts `axle serve ARGS --port P`; returns (process, base URL)."""
    assert BIN.is_file(), f"{BIN} is missing: build with cargo build --release"
    port = free_port()
    proc = subprocess.Popen([str(BIN), "serve", "--port", str(port), *map(str, args)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    wait_until_up(proc, base + health)
    return proc, base


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def write_gguf(path, arch):
    """A header-only GGUF (v3, no tensors) naming `arch`: enough for backend resolution."""
    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b
    kv = s("general.architecture") + struct.pack("<I", 8) + s(arch)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv)
