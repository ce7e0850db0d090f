"""Connection and request hygiene of `axle serve`, with raw sockets and HTTP clients that misbehave:
idle and half-sent connections are closed after the header timeout, connections over the cap get
a 503 in OpenAI's shape, a blocking request whose client goes away is cancelled and its KV freed,
and SIGTERM ends the process within the grace period whatever the clients are doing.
"""
import http.client
import json
import re
import signal
import socket
import time
import urllib.request

import pytest

from helpers import MODEL, start_axle, stop

HEADER_TIMEOUT = 1.0


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(axle_\w+) ([0-9.e+-]+)$", text, re.M)}


def wait_for(pred, seconds, what):
    end = time.time() + seconds
    while time.time() < end:
        try:
            if pred():
                return
        except OSError:  # refused, reset or a 503 while the condition is not met yet
            pass
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s: {what}")


def connect(base):
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def closed_by_server(sock, within):
    """Whether the server closes `sock` (recv gives end of stream) within `within` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


@pytest.fixture(scope="module")
def server():
    assert MODEL.is_file(), f"{MODEL} is missing: run scripts/setup.sh"
    proc, base = start_axle("--model", MODEL, "--threads", "2", "--context-len", "4096", "--kv-slots", "8192",
                            "--header-timeout", HEADER_TIMEOUT)
    yield proc, base
    stop(proc)


def test_idle_and_half_sent_connections_are_closed(server):
    _, base = server
    idle = connect(base)
    half = connect(base)
    half.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
    assert closed_by_server(idle, HEADER_TIMEOUT + 3), "an idle connection stayed open"
    assert closed_by_server(half, HEADER_TIMEOUT + 3), "a half-sent request head stayed open"
    # A keep-alive connection that goes quiet after a response is closed too.
    conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
    conn.request("GET", "/health")
    assert conn.getresponse().read()
    assert closed_by_server(conn.sock, HEADER_TIMEOUT + 3), "an idle keep-alive connection stayed open"


def test_connections_over_the_cap_get_a_503():
    # A server of its own, whose header timeout does not close the held connections first.
    proc, base = start_axle("--model", MODEL, "--threads", "2", "--max-connections", "6",
                            "--header-timeout", "30")
    try:
        over_the_cap(base)
    finally:
        stop(proc)


def over_the_cap(base):
    # Connections of the start-up health checks hold slots until the server has read their end
    # (`wait_until_up` closes them); should that come after the next accepts, the sixth held
    # connection would be the one refused and the extra one served.
    time.sleep(1.0)
    held = [connect(base) for _ in range(6)]
    time.sleep(0.2)
    extra = connect(base)
    extra.settimeout(5)
    answer = b""
    while chunk := extra.recv(4096):
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), answer
    assert json.loads(body)["error"]["code"] == "too_many_connections"
    for s in held:
        s.close()
    # Once they are gone, ordinary requests are served again.
    wait_for(lambda: urllib.request.urlopen(base + "/health", timeout=2).status == 200, 10, "health after the cap")


def test_blocking_request_of_a_departed_client_is_cancelled(server):
    _, base = server
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True, "temperature": 0})
    socks = []
    for _ in range(4):
        s = connect(base)
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        socks.append(s)
    wait_for(lambda: metrics(base)["axle_kv_blocks_used"] > 0, 30, "the requests to start")
    for s in socks:
        s.close()
    # Cancelled: no sequence runs and every KV block is free again (3000 tokens would take minutes).
    wait_for(lambda: metrics(base)["axle_running_sequences"] == 0 and metrics(base)["axle_kv_blocks_used"] == 0,
             10, "the requests to be cancelled and their KV freed")


def test_sigterm_exits_within_the_grace_period_whatever_clients_do():
    proc, base = start_axle("--model", MODEL, "--threads", "2", "--shutdown-grace", "2")
    try:
        # A client holding a half-sent request head, and one waiting on a long blocking request.
        half = connect(base)
        half.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True})
        busy = connect(base)
        busy.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        wait_for(lambda: metrics(base)["axle_kv_blocks_used"] > 0, 30, "the long request to start")
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
        took = time.time() - t0
        assert code == 0, f"exit code {code}"
        assert took < 2 + 3, f"took {took:.1f} s to exit after SIGTERM (grace 2 s)"
    finally:
        stop(proc)
