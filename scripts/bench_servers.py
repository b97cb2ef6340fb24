"""The servers a side-by-side benchmark runs one after the other: `hearth serve` and llama.cpp's
`llama-server` (`--jinja`) on the same GGUF model, each started alone, restarted when it dies or
hangs, and its log kept in a temporary file. Used by bench_structured.py and bench_tools.py.

`args` (the benchmark's argparse namespace) gives: hearth, llama_server (binaries), model, ctx,
threads, startup_timeout, timeout (per request, s) and llama_env (extra environment of llama-server).
"""
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


class ServerDown(Exception):
    pass


class Server:
    """One server process, its stderr/stdout going to a log file. `engine` is "hearth" or a name
    for llama-server."""

    def __init__(self, engine, args, log_prefix):
        self.engine, self.args = engine, args
        self.proc = None
        self.address = None
        self.log = tempfile.NamedTemporaryFile(prefix=f"{log_prefix}-{engine}-", suffix=".log", delete=False)
        self.starts = 0
        self.model_id = None
        self.cmd = None

    def command(self):
        a = self.args
        if self.engine == "hearth":
            return [a.hearth, "serve", "-m", a.model, "--backend", "cpu", "--quiet", "--port", "0",
                    "-c", str(a.ctx), "--max-batch", "1", "-t", str(a.threads)]
        self.port = free_port()
        return [a.llama_server, "-m", a.model, "--port", str(self.port), "--host", "127.0.0.1",
                "-c", str(a.ctx), "-t", str(a.threads), "--jinja", "-np", "1"]

    def start(self):
        cmd = self.cmd = self.command()
        self.starts += 1
        with open(self.log.name, "ab") as log:
            log.write(f"\n=== start {self.starts}: {' '.join(cmd)}\n".encode())
            offset = log.tell()
            env = dict(os.environ, **(self.args.llama_env if self.engine != "hearth" else {}))
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=env)
        deadline = time.monotonic() + self.args.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerDown(f"{self.engine} exited with {self.proc.returncode} before listening; see {self.log.name}")
            if self.engine == "hearth":
                with open(self.log.name, "rb") as log:
                    log.seek(offset)
                    m = re.search(rb"listening on http://(\S+)", log.read())
                if m:
                    self.address = m.group(1).decode()
                    self.find_model_id()
                    return
            else:
                self.address = f"127.0.0.1:{self.port}"
                try:
                    with urllib.request.urlopen(f"http://{self.address}/health", timeout=5) as r:
                        if r.status == 200:
                            self.find_model_id()
                            return
                except (urllib.error.URLError, OSError):
                    pass
            time.sleep(0.2)
        self.stop()
        raise ServerDown(f"{self.engine} did not come up in {self.args.startup_timeout} s; see {self.log.name}")

    def find_model_id(self):
        """The id /v1/models lists (Hearth checks a request's model against it)."""
        try:
            with urllib.request.urlopen(f"http://{self.address}/v1/models", timeout=30) as r:
                self.model_id = json.load(r)["data"][0]["id"]
        except Exception:
            self.model_id = pathlib.Path(self.args.model).stem

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def restart(self):
        self.stop()
        self.start()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(address, body, timeout):
    """(HTTP status, parsed JSON body or None, raw text)."""
    request = urllib.request.Request(f"http://{address}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            status, raw = r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read().decode("utf-8", "replace")
    try:
        return status, json.loads(raw), raw
    except json.JSONDecodeError:
        return status, None, raw


class Failed(Exception):
    """A request that got no HTTP answer: `kind` is "server down", "timeout" or "connection"."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def send(server, body, timeout):
    """POSTs `body` to `server` (restarted first if it died): (status, reply, raw, wall seconds).
    A request that gets no answer raises Failed, after restarting a server that may still be busy
    with it."""
    if not server.alive():
        try:
            server.restart()
        except ServerDown as e:
            raise Failed("server down", str(e)) from e
    start = time.perf_counter()
    try:
        status, reply, raw = post(server.address, body, timeout)
        return status, reply, raw, time.perf_counter() - start
    except (TimeoutError, socket.timeout) as e:
        message = f"timeout after {timeout} s ({e})"
        try:
            server.restart()  # it may still be generating the abandoned request
        except ServerDown as e2:
            message += f"; restart failed: {e2}"
        raise Failed("timeout", message) from e
    except (urllib.error.URLError, ConnectionError, OSError) as e:
        message = f"{type(e).__name__}: {e}"
        if not server.alive():
            message += f" (server exited with {server.proc.returncode if server.proc else '?'})"
        elif isinstance(getattr(e, "reason", None), TimeoutError):
            try:
                server.restart()
            except ServerDown as e2:
                message += f"; restart failed: {e2}"
        raise Failed("connection", message) from e


def run_engine(engine, items, args, log_prefix, run_one, describe):
    """Starts `engine`'s server, warms it up with one short request (not counted), runs
    `run_one(server, item, args)` for each item (printing `describe(item, row)` as it goes) and
    stops it. Returns the rows and the server (its command and start count)."""
    server = Server(engine, args, log_prefix)
    rows = []
    try:
        try:
            server.start()
            post(server.address, {"model": server.model_id, "messages": [{"role": "user", "content": "Say hi."}],
                                  "temperature": 0, "max_tokens": 8}, args.timeout)
        except (ServerDown, OSError, urllib.error.URLError) as e:
            print(f"{engine}: warm-up failed: {e}", file=sys.stderr)
        for i, item in enumerate(items):
            row = run_one(server, item, args)
            rows.append(row)
            print(f"[{engine} {i + 1}/{len(items)}] {describe(item, row)} ({row['wall_s'] or 0:.1f} s)",
                  file=sys.stderr, flush=True)
    finally:
        server.stop()
    print(f"{engine}: server log {server.log.name} ({server.starts} start(s))", file=sys.stderr)
    return rows, server
