#!/usr/bin/env python3
"""Fails on a breaking change of the sidecar's HTTP API against the previous release.

The previous release is the newest CHANGELOG.md heading that names a commit; its document is
`git show COMMIT:crates/leasehold-serve/openapi.json`. Breaking, for a client written against
the previous document: a removed path or method; a removed or newly required parameter; a new
required request body or request field; a request field removed where unknown fields are
refused; a narrowed request type (type, enum, bounds, length); a removed success response or
media type; a response field removed or no longer required; a response type that widened or
changed. Everything else (new paths, methods, optional fields, response fields) is additive.

    python3 scripts/openapi-compat.py              # this tree against the previous release
    python3 scripts/openapi-compat.py OLD NEW      # two files
    python3 scripts/openapi-compat.py --self-test  # each kind of break is caught
"""

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENT = "crates/leasehold-serve/openapi.json"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def previous_release():
    heading = re.compile(r"^## (\d+\.\d+\.\d+) — commit ([0-9a-f]{40})$")
    for line in (ROOT / "CHANGELOG.md").read_text().splitlines():
        m = heading.match(line)
        if m:
            return m.group(1), m.group(2)
    sys.exit("openapi-compat: CHANGELOG.md names no released commit")


class Checker:
    def __init__(self, old, new):
        self.old, self.new = old, new
        self.problems = []

    def report(self, where, what):
        self.problems.append(f"{where}: {what}")

    @staticmethod
    def resolve(doc, node):
        seen = set()
        while isinstance(node, dict) and "$ref" in node:
            ref = node["$ref"]
            if ref in seen:
                break
            seen.add(ref)
            node = doc
            for part in ref.lstrip("#/").split("/"):
                node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def old_(self, node):
        return self.resolve(self.old, node)

    def new_(self, node):
        return self.resolve(self.new, node)

    def run(self):
        old_paths, new_paths = self.old.get("paths", {}), self.new.get("paths", {})
        for path, old_item in old_paths.items():
            if path not in new_paths:
                self.report(path, "path removed")
                continue
            new_item = new_paths[path]
            for method in METHODS:
                if method not in old_item:
                    continue
                where = f"{method.upper()} {path}"
                if method not in new_item:
                    self.report(where, "method removed")
                    continue
                self.operation(where, old_item, new_item, old_item[method], new_item[method])
        return self.problems

    def params(self, resolve, item, op):
        found = {}
        for p in item.get("parameters", []) + op.get("parameters", []):
            p = resolve(p)
            found[(p.get("in"), p.get("name"))] = p
        return found

    def operation(self, where, old_item, new_item, old_op, new_op):
        old_params = self.params(self.old_, old_item, old_op)
        new_params = self.params(self.new_, new_item, new_op)
        for key, old_p in old_params.items():
            name = f"{where} parameter {key[1]} ({key[0]})"
            if key not in new_params:
                self.report(name, "parameter removed")
                continue
            new_p = new_params[key]
            if new_p.get("required") and not old_p.get("required"):
                self.report(name, "parameter became required")
            self.schema(name, old_p.get("schema", {}), new_p.get("schema", {}), "request")
        for key, new_p in new_params.items():
            if key not in old_params and new_p.get("required"):
                self.report(f"{where} parameter {key[1]} ({key[0]})", "new required parameter")

        old_body = self.old_(old_op.get("requestBody")) or {}
        new_body = self.new_(new_op.get("requestBody")) or {}
        if new_body.get("required") and not old_body.get("required"):
            self.report(where, "request body became required")
        for media, old_media in old_body.get("content", {}).items():
            new_media = new_body.get("content", {}).get(media)
            if new_media is None:
                self.report(f"{where} request {media}", "media type no longer accepted")
                continue
            self.schema(f"{where} request", old_media.get("schema", {}),
                        new_media.get("schema", {}), "request")

        new_responses = new_op.get("responses", {})
        for status, old_resp in old_op.get("responses", {}).items():
            where_r = f"{where} response {status}"
            if status not in new_responses:
                if str(status).startswith("2"):
                    self.report(where_r, "success response removed")
                continue
            old_resp, new_resp = self.old_(old_resp), self.new_(new_responses[status])
            for media, old_media in (old_resp.get("content") or {}).items():
                new_media = (new_resp.get("content") or {}).get(media)
                if new_media is None:
                    self.report(f"{where_r} {media}", "media type removed")
                    continue
                self.schema(where_r, old_media.get("schema", {}),
                            new_media.get("schema", {}), "response")

    @staticmethod
    def types(s):
        t = s.get("type")
        if t is None:
            return None
        found = set(t) if isinstance(t, list) else {t}
        if s.get("nullable"):
            found.add("null")
        if "number" in found:
            found.add("integer")
        return found

    def schema(self, where, old, new, direction, depth=0):
        old, new = self.old_(old), self.new_(new)
        if depth > 20 or not isinstance(old, dict) or not isinstance(new, dict):
            return
        ot, nt = self.types(old), self.types(new)
        if direction == "request":
            # The server must still accept everything it accepted.
            if nt is not None and (ot is None or not ot <= nt):
                self.report(where, f"request type narrowed from {sorted(ot or ['any'])} to {sorted(nt)}")
            if "enum" in new and ("enum" not in old or not set(map(json.dumps, old["enum"])) <= set(map(json.dumps, new["enum"]))):
                self.report(where, "request enum narrowed")
            for bound, tighter in (("maximum", min), ("maxLength", min), ("maxItems", min),
                                   ("minimum", max), ("minLength", max), ("minItems", max)):
                if bound in new and (bound not in old or tighter(old[bound], new[bound]) != old[bound]):
                    self.report(where, f"request {bound} narrowed ({old.get(bound)} -> {new[bound]})")
            if new.get("pattern") and new.get("pattern") != old.get("pattern"):
                self.report(where, "request pattern changed")
            old_req, new_req = set(old.get("required", [])), set(new.get("required", []))
            for field in sorted(new_req - old_req):
                self.report(f"{where}.{field}", "new required request field")
            closed = new.get("additionalProperties") is False
            for field, old_prop in old.get("properties", {}).items():
                new_prop = new.get("properties", {}).get(field)
                if new_prop is None:
                    if closed:
                        self.report(f"{where}.{field}", "request field removed (unknown fields are refused)")
                    continue
                self.schema(f"{where}.{field}", old_prop, new_prop, direction, depth + 1)
        else:
            # A client must still understand everything the server answers.
            if ot is not None and (nt is None or not nt <= ot):
                self.report(where, f"response type changed from {sorted(ot)} to {sorted(nt or ['any'])}")
            old_req, new_req = set(old.get("required", [])), set(new.get("required", []))
            for field, old_prop in old.get("properties", {}).items():
                new_prop = new.get("properties", {}).get(field)
                if new_prop is None:
                    self.report(f"{where}.{field}", "response field removed")
                    continue
                if field in old_req and field not in new_req:
                    self.report(f"{where}.{field}", "response field no longer always present")
                self.schema(f"{where}.{field}", old_prop, new_prop, direction, depth + 1)
        if "items" in old and "items" in new:
            self.schema(f"{where}[]", old["items"], new["items"], direction, depth + 1)
        for combinator in ("oneOf", "anyOf", "allOf"):
            if combinator in old and combinator in new and len(old[combinator]) == len(new[combinator]):
                for i, (o, n) in enumerate(zip(old[combinator], new[combinator])):
                    self.schema(f"{where}<{combinator}[{i}]>", o, n, direction, depth + 1)


def check(old, new):
    return Checker(old, new).run()


def self_test(doc):
    """Each kind of break is caught in the current document; the document itself passes."""
    assert check(doc, doc) == [], check(doc, doc)
    schemas = doc["components"]["schemas"]

    def broken(change):
        new = copy.deepcopy(doc)
        change(new)
        return check(doc, new)

    first_path = next(iter(doc["paths"]))
    cases = {
        "path removed": lambda d: d["paths"].pop(first_path),
        "method removed": lambda d: d["paths"]["/v1/leases/{name}/acquire"].pop("post"),
        "response field removed": lambda d: d["components"]["schemas"]["AcquireResponse"]["properties"].pop(
            next(iter(schemas["AcquireResponse"]["properties"]))),
        "new required request field": lambda d: d["components"]["schemas"]["AcquireRequest"]["required"].append("wait_ms"),
        "request type narrowed": lambda d: d["components"]["schemas"]["AcquireRequest"]["properties"]["holder"].update(type="integer"),
        "request maximum narrowed": lambda d: d["components"]["schemas"]["AcquireRequest"]["properties"]["ttl_ms"].update(maximum=5000),
        "request enum narrowed": lambda d: d["components"]["schemas"]["TickRequest"]["properties"]["on_store_down"]["enum"].pop(),
        "response type changed": lambda d: d["components"]["schemas"]["AcquireResponse"]["properties"][
            next(iter(schemas["AcquireResponse"]["properties"]))].update(type="object"),
    }
    for what, change in cases.items():
        found = broken(change)
        assert found, f"self-test: {what} not caught"
        print(f"openapi-compat self-test: {what}: {found[0]}")
    additive = copy.deepcopy(doc)
    additive["paths"]["/v1/new"] = {"get": {"responses": {"200": {"description": "new"}}}}
    additive["components"]["schemas"]["AcquireRequest"]["properties"]["extra"] = {"type": "string"}
    additive["components"]["schemas"]["AcquireResponse"]["properties"]["extra"] = {"type": "string"}
    assert check(doc, additive) == [], check(doc, additive)
    print("openapi-compat self-test: additive changes pass")


def main(argv):
    if argv == ["--self-test"]:
        self_test(json.loads((ROOT / DOCUMENT).read_text()))
        return 0
    if len(argv) == 2:
        old = json.loads(Path(argv[0]).read_text())
        new = json.loads(Path(argv[1]).read_text())
        against = argv[0]
    elif not argv:
        version, commit = previous_release()
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{DOCUMENT}"],
                               capture_output=True, text=True)
        if shown.returncode != 0:
            sys.exit(f"openapi-compat: cannot read {DOCUMENT} of release {version} ({commit}): "
                     f"{shown.stderr.strip()} (a shallow clone? fetch the full history)")
        old = json.loads(shown.stdout)
        new = json.loads((ROOT / DOCUMENT).read_text())
        against = f"release {version} ({commit[:12]})"
    else:
        sys.exit(__doc__)
    problems = check(old, new)
    for p in problems:
        print(f"openapi-compat: breaking change against {against}: {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"openapi-compat: {DOCUMENT} is compatible with {against}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
