#!/usr/bin/env python3
"""Calls per request to the functions a pattern names, by caller, from one
callgrind dump (e.g. the gateway's last dump of `PROTOCOLS=h1
INSTRUCTIONS=1 DUMPS=<dir> bench/ingress.sh`, whose large run has REQUESTS
requests):

    bench/callgrind-calls.py <dump> '^__rustc::__rust_alloc$' [requests]

prints the calls per request in all, then per caller (calls per request,
inclusive instructions per request of those calls, caller). The dump holds
the large run's handshakes too (10 connections), a few calls in all.
"""
import collections
import re
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    dump, pattern = sys.argv[1], re.compile(sys.argv[2])
    requests = int(sys.argv[3]) if len(sys.argv) > 3 else 2200
    names = {}

    def name(spec):
        # "(id) name" defines an id; "(id)" refers to one.
        m = re.match(r"\((\d+)\)(?: (.*))?", spec)
        if not m:
            return spec
        if m.group(2):
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), "?")

    calls, cost = collections.Counter(), collections.Counter()
    caller = callee = None
    with open(dump) as f:
        lines = iter(f)
        for line in lines:
            if line.startswith("fn="):
                caller = name(line[3:].strip())
            elif line.startswith("cfn="):
                callee = name(line[4:].strip())
            elif line.startswith("calls="):
                n = int(line[6:].split()[0])
                fields = next(lines).split()
                if callee and pattern.search(callee):
                    calls[caller] += n
                    cost[caller] += int(fields[1]) if len(fields) > 1 else 0
    print(f"{sum(calls.values()) / requests:.2f} calls per request")
    for who, n in calls.most_common(30):
        print(f"{n / requests:8.2f} {cost[who] / requests:8.0f}  {who[:140]}")


if __name__ == "__main__":
    main()
