"""A labelled stand-in for vLLM's server process: a real subprocess answering ``/health`` on the
port day0 chose, for tests of how day0 starts, waits for and stops a server (vLLM's minute of
imports would only slow them). ``python -c FAKE_SERVER PORT DELAY_S [rpc]``: healthy after
``DELAY_S``; with ``rpc`` it also does what vLLM 0.32 does with its IPC sockets: binds one under
``VLLM_RPC_BASE_PATH`` and, on SIGTERM, exits without unlinking it."""

FAKE_SERVER = """
import http.server, os, signal, socket, sys, time, uuid
if sys.argv[3:] == ["rpc"]:
    rpc = socket.socket(socket.AF_UNIX)
    rpc.bind(os.path.join(os.environ.get("VLLM_RPC_BASE_PATH", "/nonexistent"), str(uuid.uuid4())))
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
time.sleep(float(sys.argv[2]))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
