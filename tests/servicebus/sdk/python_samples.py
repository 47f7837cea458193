"""Runs the official Python SDK's own samples, unmodified, against the emulator.

Usage: python_samples.py CACHE_DIR EMULATOR_PORT SLOTS HTTP_PORT

- Downloads the source distribution of the installed `azure-servicebus` version from PyPI into
  CACHE_DIR (once; `pip download --no-binary :all: --no-deps`) and unpacks its `samples/`. The
  samples are never copied into the repository.
- Most samples connect with `ServiceBusClient(SERVICEBUS_FULLY_QUALIFIED_NAMESPACE,
  DefaultAzureCredential())`: TLS on port 5671 and an Entra ID token. They run in a private
  network namespace (`unshare --user --net --mount`, no root needed) that plays the part of
  Azure: `localhost:5671` is a TLS front for the emulator (through a Unix socket, as the
  namespace has its own loopback), a managed-identity endpoint (`IDENTITY_ENDPOINT`, as App
  Service provides) hands `DefaultAzureCredential` a token, and the namespace's view of
  certifi's CA bundle trusts the test CA. The emulator runs with `--accept-jwt`. Samples that
  read SERVICEBUS_CONNECTION_STR get the emulator's own connection string (plain AMQP on the
  emulator's port, also forwarded inside the namespace).
- The `ServiceBusAdministrationClient` samples (`mgmt_*`, `topic_subscription_with_rule_operations`)
  call `https://localhost/…` (port 443): inside the namespace that is a TLS front for the
  emulator's HTTP management listener (HTTP_PORT, `--http-listen`); the async ones go through
  aiohttp, which trusts OpenSSL's default bundle, hence `SSL_CERT_FILE` (and `REQUESTS_CA_BUNDLE`
  for the sync ones) naming the same bundle.
- Each sample gets its own entities (slot i: queue `sample-q-i`, session queue `sample-sq-i`,
  topic `sample-t-i` with subscription `sample-s` and session subscription `sample-ss`, used by
  the samples that list subscription sessions; tests/servicebus/python.rs declares SLOTS of them)
  so they run in parallel without reading each other's messages.

Prints `sample NAME: ok (Ns)`, `sample NAME: FAILED ...` or `sample NAME: not applicable (why)`
per sample, then `python samples: N passed, M not applicable`. Exit status 0 when every
applicable sample passed, 1 when one failed, 3 when a dependency is missing (the first line then
starts with `skipped:`).
"""
import asyncio
import concurrent.futures
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SAMPLE_TIMEOUT = 180
PARALLEL = 4
KEY_NAME = "RootManageSharedAccessKey"
KEY = "SAS_KEY_VALUE"

# Why a sample cannot run against a local emulator, by the text that gives it away. Checked in
# order; the first match wins.
NOT_APPLICABLE = [
    ("EnvironmentCredential()", "needs an Entra ID service principal (client secret against login.microsoftonline.com)"),
    ("<custom_endpoint_hostname>", "needs the sample edited: its custom endpoint address is a placeholder"),
    ("http_proxy", "needs an HTTP proxy"),
    ("sleep(100)", f"sleeps 100 s twice and then 80 s on purpose, longer than the {SAMPLE_TIMEOUT} s allowed per sample"),
]


def skip(reason):
    print(f"skipped: {reason}", flush=True)
    sys.exit(3)


def sdk_version():
    import azure.servicebus

    return azure.servicebus.__version__


def samples_dir(cache):
    version = sdk_version()
    root = Path(cache) / f"azure_servicebus-{version}"
    samples = root / "samples"
    if samples.is_dir():
        return samples
    Path(cache).mkdir(parents=True, exist_ok=True)
    download = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-binary", ":all:",
         "--no-deps", f"azure-servicebus=={version}", "-d", cache],
        capture_output=True, text=True,
    )
    sdist = Path(cache) / f"azure_servicebus-{version}.tar.gz"
    if download.returncode != 0 or not sdist.is_file():
        skip(f"cannot download azure-servicebus {version} from PyPI: {download.stderr.strip()[-300:]}")
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(f"azure_servicebus-{version}/samples/")]
        archive.extractall(cache, members=members, filter="data")
    return samples


def classify(path):
    text = path.read_text(encoding="utf-8")
    for needle, reason in NOT_APPLICABLE:
        if needle in text:
            return reason
    if "in receiver:" in text and "max_wait_time" not in text:
        return "iterates its receiver without max_wait_time, so it never exits on its own (against Service Bus either)"
    return None


# --- inside the namespace ----------------------------------------------------------------------


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def forward_to(unix_path):
    async def handle(reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(unix_path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return handle


class Identity(BaseHTTPRequestHandler):
    """App Service's managed-identity endpoint (`IDENTITY_ENDPOINT`, api-version 2019-08-01)."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.headers.get("X-IDENTITY-HEADER") != os.environ["IDENTITY_HEADER"]:
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps({
            "access_token": "emulator-entra-token",
            "expires_on": str(int(time.time()) + 3600),
            "resource": "https://servicebus.azure.net",
            "token_type": "Bearer",
            "client_id": "00000000-0000-0000-0000-000000000000",
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve_fronts(unix_path, http_unix_path, port, cert, key, ready):
    async def main():
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        await asyncio.start_server(forward_to(unix_path), "127.0.0.1", 5671, ssl=context)
        await asyncio.start_server(forward_to(http_unix_path), "127.0.0.1", 443, ssl=context)
        await asyncio.start_server(forward_to(unix_path), "127.0.0.1", port)
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def run_sample(path, env):
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, str(path)], cwd=path.parent, env=env, capture_output=True,
                              text=True, timeout=SAMPLE_TIMEOUT)
        ok, output = done.returncode == 0, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        ok, output = False, f"timed out after {SAMPLE_TIMEOUT}s\n{e.stdout or ''}{e.stderr or ''}"
    return ok, time.monotonic() - started, output


def inner(samples, unix_path, http_unix_path, port, slots, workdir):
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    import certifi

    bundle = Path(workdir) / "bundle.pem"
    bundle.write_text(Path(certifi.where()).read_text() + (Path(workdir) / "ca.pem").read_text())
    subprocess.run(["mount", "--bind", str(bundle), certifi.where()], check=True)

    ready = threading.Event()
    threading.Thread(target=serve_fronts, daemon=True,
                     args=(unix_path, http_unix_path, port, f"{workdir}/cert.pem", f"{workdir}/key.pem",
                           ready)).start()
    identity = ThreadingHTTPServer(("127.0.0.1", 0), Identity)
    threading.Thread(target=identity.serve_forever, daemon=True).start()
    ready.wait(10)

    header = os.urandom(8).hex()
    os.environ["IDENTITY_HEADER"] = header
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "SERVICEBUS_"))}
    base.update({
        "IDENTITY_ENDPOINT": f"http://127.0.0.1:{identity.server_address[1]}/msi/token",
        "IDENTITY_HEADER": header,
        "SERVICEBUS_FULLY_QUALIFIED_NAMESPACE": "localhost",
        "SSL_CERT_FILE": str(bundle),
        "REQUESTS_CA_BUNDLE": str(bundle),
        "SERVICEBUS_CONNECTION_STR": f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName={KEY_NAME};"
                                     f"SharedAccessKey={KEY};UseDevelopmentEmulator=true;",
        "SERVICEBUS_SAS_POLICY": KEY_NAME,
        "SERVICEBUS_SAS_KEY": KEY,
        "SERVICEBUS_SUBSCRIPTION_NAME": "sample-s",
    })

    paths = sorted(samples.glob("*_samples/*.py"))
    runnable, results = [], {}
    for path in paths:
        reason = classify(path)
        if reason:
            results[path] = f"not applicable ({reason})"
        else:
            runnable.append(path)
    if len(runnable) > slots:
        print(f"only {slots} entity slots for {len(runnable)} samples", flush=True)
        sys.exit(1)
    failed = []
    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        futures = {}
        for slot, path in enumerate(runnable):
            env = dict(base, SERVICEBUS_QUEUE_NAME=f"sample-q-{slot}", SERVICEBUS_TOPIC_NAME=f"sample-t-{slot}",
                       SERVICEBUS_SESSION_QUEUE_NAME=f"sample-sq-{slot}", SERVICEBUS_SESSION_ID="session-1")
            if "subscription_sessions" in path.read_text(encoding="utf-8"):
                # Listing a subscription's sessions needs a session-enabled subscription.
                env["SERVICEBUS_SUBSCRIPTION_NAME"] = "sample-ss"
            futures[pool.submit(run_sample, path, env)] = path
        for future in concurrent.futures.as_completed(futures):
            path = futures[future]
            ok, seconds, output = future.result()
            if ok:
                results[path] = f"ok ({seconds:.1f}s)"
            else:
                results[path] = f"FAILED after {seconds:.1f}s\n{output[-4000:]}"
                failed.append(path)
    for path in paths:
        print(f"sample {path.parent.name}/{path.name}: {results[path]}", flush=True)
    na = len(paths) - len(runnable)
    print(f"python samples: {len(runnable) - len(failed)} passed, {len(failed)} failed, {na} not applicable",
          flush=True)
    sys.exit(1 if failed else 0)


# --- outside -----------------------------------------------------------------------------------


def make_certificates(workdir):
    """A CA and a `localhost` server certificate signed by it."""
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=workdir, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=sb-inbox test CA",
            "-keyout", "ca-key.pem", "-out", "ca.pem")
    Path(workdir, "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "key.pem", "-out", "cert.csr")
    openssl("x509", "-req", "-in", "cert.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
            "-days", "2", "-extfile", "ext.cnf", "-out", "cert.pem")


def bridge(unix_path, port):
    """Unix socket → the emulator's TCP port (the namespace cannot reach the host loopback)."""
    async def handle(reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def main(ready):
        await asyncio.start_unix_server(handle, unix_path)
        ready.set()
        await asyncio.Event().wait()

    ready = threading.Event()
    threading.Thread(target=lambda: asyncio.run(main(ready)), daemon=True).start()
    ready.wait(10)


def outer(cache, port, slots, http_port):
    try:
        import aiohttp  # noqa: F401  (azure-identity's async credentials need it)
        import azure.identity  # noqa: F401  (the samples import it)
    except ImportError as e:
        skip(f"{e.name} is not installed (.ci/run installs it)")
    for tool in ("unshare", "ip", "mount", "openssl"):
        if shutil.which(tool) is None:
            skip(f"`{tool}` is not installed")
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        skip(f"cannot create a user and network namespace: {probe.stderr.decode().strip()}")
    samples = samples_dir(cache)
    with tempfile.TemporaryDirectory(prefix="sb-samples-") as workdir:
        make_certificates(workdir)
        unix_path = os.path.join(workdir, "emulator.sock")
        bridge(unix_path, port)
        http_unix_path = os.path.join(workdir, "management.sock")
        bridge(http_unix_path, http_port)
        run = subprocess.run(
            ["unshare", "--user", "--map-root-user", "--net", "--mount", sys.executable, __file__, "--inner",
             str(samples), unix_path, http_unix_path, str(port), str(slots), workdir])
        sys.exit(run.returncode)


if __name__ == "__main__":
    if sys.argv[1] == "--inner":
        inner(Path(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), sys.argv[7])
    else:
        outer(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
