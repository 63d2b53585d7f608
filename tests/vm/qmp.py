"""A QMP client for the guest tests: qmp.py SOCKET COMMAND [JSON_ARGUMENTS]; prints the
command's "return" as JSON, exits 1 with the error on an error answer."""
import json
import socket
import sys

s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect(sys.argv[1])
f = s.makefile("rw")


def call(cmd, args=None):
    msg = {"execute": cmd}
    if args:
        msg["arguments"] = args
    f.write(json.dumps(msg) + "\n")
    f.flush()
    while True:
        r = json.loads(f.readline())
        if "event" in r:
            continue
        return r


json.loads(f.readline())  # the greeting
call("qmp_capabilities")
r = call(sys.argv[2], json.loads(sys.argv[3]) if len(sys.argv) > 3 else None)
if "error" in r:
    print(json.dumps(r["error"]), file=sys.stderr)
    sys.exit(1)
print(json.dumps(r["return"]))
