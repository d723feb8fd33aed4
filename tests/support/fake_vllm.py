"""A labelled stand-in for vLLM's server process: a real subprocess answering ``/health`` on the
port day0 chose, for tests of how day0 starts, waits for and stops a server (vLLM's minute of
imports would only slow them). ``python -c FAKE_SERVER PORT DELAY_S``: healthy after ``DELAY_S``."""

FAKE_SERVER = """
import http.server, sys, time
time.sleep(float(sys.argv[2]))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
