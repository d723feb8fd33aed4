"""A labelled stand-in for ssh and the sshd at the other end, on this host: for tests of what
day0 sends over ssh (the command line, the remote script, the environment on stdin) without a
second host. ``ssh [OPTIONS] HOST REMOTE`` runs ``sh -c REMOTE`` in a session of its own (sshd's
child is a session leader, out of reach of a signal to the client's group), relays this process's
stdin to it, and when this process dies the remote stdin closes, as a dropped connection's does.
It ends when the remote command does, with its exit status."""

FAKE_SSH = """
import os, subprocess, sys, threading
remote = subprocess.Popen(["sh", "-c", sys.argv[-1]], stdin=subprocess.PIPE, start_new_session=True)

def relay():
    try:
        while chunk := os.read(0, 65536):
            remote.stdin.write(chunk)
            remote.stdin.flush()
        remote.stdin.close()
    except (BrokenPipeError, ValueError):
        pass

threading.Thread(target=relay, daemon=True).start()
sys.exit(remote.wait())  # like ssh: done when the remote command is, whatever its stdin
"""
