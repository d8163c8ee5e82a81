#!/usr/bin/env python3
"""`helm template` and `helm lint` without a helm binary.

Renders and lints charts with Helm's own Go SDK (v4) through the PyPI package
`helm-python-sdk` (import name `helm_python`), which bundles it as a native
library: no download at run time, no cluster. tests/deploy.rs drives this;
.ci/run installs the package.

    helm.py template CHART [-f VALUES]... [--name NAME] [--namespace NS]
    helm.py lint CHART [-f VALUES]... [--strict]

`template` prints every rendered manifest as `helm template` does (one
`# Source:` comment per template, NOTES.txt and empty output left out);
`lint --strict` fails on warnings as well as errors.
"""

import argparse
import sys

try:
    import helm_python as helm
except ImportError:  # pragma: no cover - the message is the point
    sys.stderr.write(
        "helm.py: the Python package helm-python-sdk is not installed "
        "(pip install 'helm-python-sdk==0.2.2'; .ci/run does this)\n"
    )
    sys.exit(3)


def merge(base, top):
    """Values files merge as Helm merges them: maps deeply, the rest replaced."""
    if isinstance(base, dict) and isinstance(top, dict):
        out = dict(base)
        for key, value in top.items():
            out[key] = merge(base.get(key), value) if key in base else value
        return out
    return top


def load_values(paths):
    values = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            values = merge(values, helm.values_from_yaml(f.read()) or {})
    return values


def template(args):
    values = load_values(args.values)
    with helm.Chart.load(args.chart) as chart:
        manifests = chart.render(
            values, name=args.name, namespace=args.namespace, is_install=True
        )
    for path in sorted(manifests):
        text = manifests[path]
        if path.endswith("NOTES.txt") or not text.strip():
            continue
        # A template may hold several documents; keep them together under
        # one Source comment, as helm does.
        body = text.strip("\n")
        if body.startswith("---"):
            body = body[3:].lstrip("\n")
        sys.stdout.write(f"---\n# Source: {path}\n{body}\n")
    return 0


def lint(args):
    values = load_values(args.values)
    report = helm.lint(args.chart, values, strict=args.strict, namespace=args.namespace)
    failed = bool(report.get("errors"))
    names = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}
    for message in report.get("messages") or []:
        severity = message.get("severity", 0)
        print(f"[{names.get(severity, severity)}] {message.get('path')}: {message.get('error')}")
        if severity >= 3 or (args.strict and severity >= 2):
            failed = True
    for error in report.get("errors") or []:
        print(f"[ERROR] {error}")
    charts = report.get("total_charts_linted", 0)
    print(f"{charts} chart(s) linted, {'failed' if failed else 'ok'}")
    return 1 if failed or charts < 1 else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("template", "lint"):
        p = sub.add_parser(name)
        p.add_argument("chart")
        p.add_argument("-f", "--values", action="append", default=[])
        p.add_argument("--namespace", default="default")
        if name == "template":
            p.add_argument("--name", default="release-name")
        else:
            p.add_argument("--strict", action="store_true")
    args = parser.parse_args()
    try:
        return template(args) if args.command == "template" else lint(args)
    except helm.HelmError as e:  # render failures, bad values
        sys.stderr.write(f"helm.py {args.command} {args.chart}: {e}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
