#!/usr/bin/env python3
"""Vendors the Kubernetes protobuf schemas kube-sim and the facade speak.

    kube-api/proto/vendor.py API_CHECKOUT APIMACHINERY_CHECKOUT

API_CHECKOUT and APIMACHINERY_CHECKOUT are git checkouts of
github.com/kubernetes/api and github.com/kubernetes/apimachinery at the tag of
the recorded API server (v0.36.2 for kube-apiserver 1.36.2). It copies, for
every group/version kube-sim serves, the upstream `generated.proto` (the
schema go-to-protobuf wrote, which the API server itself encodes with), and
writes `fields.tsv`: for each Go struct field that has a protobuf tag, its
JSON name and whether it is a pointer, `omitempty`, `omitzero` or inlined,
and how server-side apply's field sets treat it (`+listType`, `+listMapKey`,
`+mapType`, `+structType`, or a patch merge key). The proto files
cannot say those; the Go types can, and protobuf <-> JSON needs them to write
what the API server's Go code writes (a non-pointer field is always on the
wire, a pointer only when set; `json:",inline"` fields merge into their
parent). Nothing here is written by hand: rerun it to move to another release.
"""

import os
import re
import shutil
import sys

# What kube-sim serves (kube-sim/fixtures/discovery), plus the machinery they import.
API_GROUPS = [
    "core/v1", "admissionregistration/v1", "apps/v1", "authentication/v1",
    "authorization/v1", "autoscaling/v1", "autoscaling/v2", "batch/v1",
    "certificates/v1", "coordination/v1", "discovery/v1", "events/v1",
    "networking/v1", "node/v1", "policy/v1", "rbac/v1", "resource/v1",
    "scheduling/v1", "storage/v1",
]
MACHINERY = [
    "pkg/apis/meta/v1", "pkg/runtime", "pkg/runtime/schema",
    "pkg/util/intstr", "pkg/api/resource",
]

TAG = re.compile(r'`([^`]*)`')
JSON_TAG = re.compile(r'(?:^|\s)json:"([^"]*)"')
PB_TAG = re.compile(r'(?:^|\s)protobuf:"([^"]*)"')


def go_fields(directory, go_package):
    """(message, proto field, json name, flags) for every tagged field."""
    rows = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".go") or name.endswith("_test.go") or name.startswith("zz_"):
            continue
        struct = None
        depth = 0
        markers = []
        for line in open(os.path.join(directory, name), encoding="utf-8"):
            stripped = line.strip()
            if stripped.startswith("// +"):
                markers.append(stripped[3:].strip())
                continue
            if stripped.startswith("//"):
                continue
            m = re.match(r'^type (\w+) struct \{$', stripped)
            if m and depth == 0:
                struct, depth = m.group(1), 1
                if "+structType=atomic" in markers:
                    # A row without a field: the whole struct is atomic.
                    message = go_package.replace("/", ".") + "." + struct
                    rows.append((message, "", "", "atomic"))
                markers = []
                continue
            if struct is None:
                markers = []
                continue
            field_markers, markers = markers, []
            depth += stripped.count("{") - stripped.count("}")
            if depth <= 0:
                struct, depth = None, 0
                continue
            tag = TAG.search(stripped)
            if not tag or depth != 1:
                continue
            pb = PB_TAG.search(tag.group(1))
            if not pb:
                continue
            proto_name = next((p[5:] for p in pb.group(1).split(",") if p.startswith("name=")), None)
            if proto_name is None:
                continue
            before = stripped[:tag.start()].split()
            go_type = before[0] if len(before) == 1 else before[1]
            js = JSON_TAG.search(tag.group(1))
            json_opts = js.group(1).split(",") if js else [""]
            json_name = json_opts[0]
            flags = []
            if go_type.startswith("*"):
                flags.append("ptr")
            if "omitempty" in json_opts[1:]:
                flags.append("omitempty")
            if "omitzero" in json_opts[1:]:
                flags.append("omitzero")
            if "inline" in json_opts[1:]:
                flags.append("inline")
            # How server-side apply's field sets see the field.
            for marker in field_markers:
                key, _, value = marker[1:].partition("=")
                if key == "listType" and value in ("map", "set", "atomic"):
                    flags.append("list=" + value)
                elif key == "listMapKey":
                    flags.append("key=" + value)
                elif key == "mapType" and value == "atomic":
                    flags.append("map=atomic")
            merge_key = re.search(r'patchMergeKey:"([^"]*)"', tag.group(1))
            if merge_key and not any(f.startswith("list=") for f in flags):
                flags += ["list=map", "key=" + merge_key.group(1)]
            elif 'patchStrategy:"merge' in tag.group(1) and not any(f.startswith("list=") for f in flags):
                flags.append("list=set")
            if js is None:
                # No json tag: Go's encoder uses the field name itself.
                json_name = before[0]
            message = go_package.replace("/", ".") + "." + struct
            rows.append((message, proto_name, json_name, ",".join(flags)))
    return rows


def main():
    api, machinery = sys.argv[1], sys.argv[2]
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "k8s.io")
    shutil.rmtree(out, ignore_errors=True)
    rows = []
    for gv in API_GROUPS:
        dest = os.path.join(out, "api", gv)
        os.makedirs(dest)
        shutil.copy(os.path.join(api, gv, "generated.proto"), dest)
        rows += go_fields(os.path.join(api, gv), "k8s.io/api/" + gv)
    for p in MACHINERY:
        dest = os.path.join(out, "apimachinery", p)
        os.makedirs(dest)
        shutil.copy(os.path.join(machinery, p, "generated.proto"), dest)
        rows += go_fields(os.path.join(machinery, p), "k8s.io/apimachinery/" + p)
    with open(os.path.join(here, "fields.tsv"), "w", encoding="utf-8") as f:
        f.write("# message\tproto field\tjson name\tflags (generated by vendor.py from the Go types)\n")
        for row in rows:
            f.write("\t".join(row) + "\n")


if __name__ == "__main__":
    main()
