#!/usr/bin/env python3
"""A small kustomize renderer: just what deploy/k8s uses, nothing else.

    python3 kustomize_lite.py DIR [--component DIR ...]   # prints the YAML stream

Debian 12 packages no kustomize (kubernetes-client is kubectl 1.20, whose
kustomize v2 predates binaryData), so k8s_test.sh renders deploy/k8s with
this, and compares the result with `kubectl kustomize` wherever a kubectl is
installed. Anything it does not implement is an error, never ignored, so a
kustomization that renders here renders the same with the real tool.

Implemented (kustomize v5 semantics, read from sigs.k8s.io/kustomize):
- kind Kustomization (kustomize.config.k8s.io/v1beta1) and Component
  (v1alpha1); fields resources, components, generatorOptions,
  configMapGenerator, patches; processed in kustomize's order: resources,
  components, generators, patches, then name references;
- resources: YAML files, or folders holding a kustomization (rendered
  first); components: folders holding a Component, applied to what the
  including kustomization has accumulated so far;
- configMapGenerator entries with `name` and `files` (`KEY=PATH` or `PATH`,
  whose key is the file's name): UTF-8 files go to `data`, others to
  `binaryData` as base64 in 70-character lines (kyaml's encodeBase64);
  keys must match [-._a-zA-Z0-9]+ and be unique; files must lie inside the
  kustomization's folder, symbolic links resolved (kustomize's default load
  restrictor, which `kubectl apply -k` cannot lift);
- generatorOptions labels, annotations, immutable, disableNameSuffixHash;
  unless disabled, the name gets kustomize's content hash suffix (sha256 of
  the ConfigMap's kind, data, binaryData and an empty name, as Go's
  json.Marshal writes them; the first 10 hex digits with 0, 1, 3, a, e
  replaced by g, h, k, m, t);
- patches given by `path` plus a `target` (group, version, kind, name),
  each a JSON patch (RFC 6902 ops add, remove, replace, test);
- references to a generated ConfigMap by its generator name are renamed in
  pod templates (volumes, projected volumes, env, envFrom) of Pods,
  Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs and CronJobs.
"""
import argparse
import base64
import copy
import hashlib
import json
import os
import re
import sys

import yaml

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "resources", "components",
                        "generatorOptions", "configMapGenerator", "patches"}
GENERATOR_FIELDS = {"name", "files"}
GENERATOR_OPTION_FIELDS = {"labels", "annotations", "immutable",
                           "disableNameSuffixHash"}
TARGET_FIELDS = {"group", "version", "kind", "name"}
KEY_PATTERN = re.compile(r"^[-._a-zA-Z0-9]+$")


class RenderError(Exception):
    """A kustomization this renderer cannot (or kustomize would not) render."""


def _fail(where, message):
    raise RenderError("%s: %s" % (where, message))


def _find_kustomization(folder):
    for name in KUSTOMIZATION_FILES:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    _fail(folder, "no kustomization.yaml")


def _load_inside(root, relative, where):
    """Reads RELATIVE (a path from ROOT) as kustomize's default restrictor
    allows: the resolved file must lie inside the resolved ROOT."""
    real_root = os.path.realpath(root)
    path = os.path.realpath(os.path.join(root, relative))
    if os.path.commonpath([real_root, path]) != real_root:
        _fail(where, "security: file '%s' is not in or below '%s'"
              % (path, real_root))
    if not os.path.isfile(path):
        _fail(where, "no file %s" % path)
    with open(path, "rb") as f:
        return f.read()


def _yaml_documents(data, where):
    try:
        return [d for d in yaml.safe_load_all(data) if d is not None]
    except yaml.YAMLError as e:
        _fail(where, "not YAML: %s" % e)


def go_json(value):
    """json.Marshal's bytes for maps of strings (keys sorted, HTML escaped)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text.encode("utf-8")


def configmap_hash(configmap):
    """kustomize's api/hasher: the suffix of a generated ConfigMap's name.
    Its "name" field is always "": the hasher looks the name up as the one
    field "metadata/name" (yaml.Lookup takes path segments), finds nothing,
    and encodes an empty string; so two generators with the same content get
    the same suffix. Checked against kubectl kustomize (v5.5)."""
    encoded = {"kind": "ConfigMap", "name": "",
               "data": configmap.get("data", "")}
    if isinstance(configmap.get("binaryData"), dict):
        encoded["binaryData"] = configmap["binaryData"]
    digest = hashlib.sha256(go_json(encoded)).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def encode_base64(data):
    """kyaml's encodeBase64: 70-character lines, each ended by a newline
    when there is more than one line's worth (the length over 70, plus 1)."""
    text = base64.b64encode(data).decode("ascii")
    lines = len(text) // 70 + 1
    chunks = [text[i:i + 70] for i in range(0, len(text), 70)]
    return "".join(c + "\n" for c in chunks) if lines > 1 else "".join(chunks)


def _generate_configmap(root, args, options, where):
    unknown = set(args) - GENERATOR_FIELDS
    if unknown:
        _fail(where, "configMapGenerator fields not implemented: %s"
              % sorted(unknown))
    name = args.get("name")
    if not name:
        _fail(where, "a configMapGenerator entry needs a name")
    data, binary = {}, {}
    for source in args.get("files") or []:
        if "=" in source:
            key, path = source.split("=", 1)
            if not key or not path or "=" in path:
                _fail(where, "bad file source %r" % source)
        else:
            key, path = os.path.basename(source), source
        if not KEY_PATTERN.match(key):
            _fail(where, "ConfigMap %s: key %r must match [-._a-zA-Z0-9]+"
                  % (name, key))
        if key in data or key in binary:
            _fail(where, "configmap %s illegally repeats the key `%s`"
                  % (name, key))
        content = _load_inside(root, path, where)
        try:
            data[key] = content.decode("utf-8")
        except UnicodeDecodeError:
            binary[key] = encode_base64(content)
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": name}}
    if options.get("labels"):
        configmap["metadata"]["labels"] = dict(options["labels"])
    if options.get("annotations"):
        configmap["metadata"]["annotations"] = dict(options["annotations"])
    if data:
        configmap["data"] = data
    if binary:
        configmap["binaryData"] = binary
    if options.get("immutable"):
        configmap["immutable"] = True
    if not options.get("disableNameSuffixHash"):
        configmap["metadata"]["name"] = "%s-%s" % (name, configmap_hash(configmap))
    return configmap


def _pointer(path, where):
    if path == "":
        return []
    if not path.startswith("/"):
        _fail(where, "JSON pointer %r must start with '/'" % path)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(document, parts, where, path):
    node = document
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            _fail(where, "JSON patch path %s does not exist" % path)
    return node


def apply_json_patch(document, operations, where):
    """RFC 6902 add, remove, replace and test on a copy of DOCUMENT."""
    document = copy.deepcopy(document)
    if not isinstance(operations, list):
        _fail(where, "only JSON patches (a YAML list of operations) are "
              "implemented, not strategic merge patches")
    for op in operations:
        kind, path = op.get("op"), op.get("path", "")
        parts = _pointer(path, where)
        if not parts:
            _fail(where, "patching the whole document is not implemented")
        parent = _walk(document, parts[:-1], where, path)
        last = parts[-1]
        if kind == "test":
            if _walk(document, parts, where, path) != op.get("value"):
                _fail(where, "JSON patch test failed: %s is %r, not %r" % (
                    path, _walk(document, parts, where, path), op.get("value")))
        elif kind == "add":
            value = copy.deepcopy(op["value"])
            if isinstance(parent, list):
                if last == "-":
                    parent.append(value)
                elif last.isdigit() and int(last) <= len(parent):
                    parent.insert(int(last), value)
                else:
                    _fail(where, "JSON patch add: bad index in %s" % path)
            elif isinstance(parent, dict):
                parent[last] = value
            else:
                _fail(where, "JSON patch add: %s has no container" % path)
        elif kind in ("remove", "replace"):
            _walk(document, parts, where, path)  # must exist
            key = int(last) if isinstance(parent, list) else last
            if kind == "remove":
                del parent[key]
            else:
                parent[key] = copy.deepcopy(op["value"])
        else:
            _fail(where, "JSON patch op %r is not implemented" % kind)
    return document


def _matches(resource, target):
    api = resource.get("apiVersion", "")
    group, _, version = api.rpartition("/")
    checks = {"group": group, "version": version, "kind": resource.get("kind"),
              "name": resource.get("metadata", {}).get("name")}
    return all(checks[k] == v for k, v in target.items())


def _pod_specs(resource):
    kind, spec = resource.get("kind"), resource.get("spec") or {}
    if kind == "Pod":
        return [spec]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        return [spec.get("template", {}).get("spec") or {}]
    if kind == "CronJob":
        return [spec.get("jobTemplate", {}).get("spec", {})
                .get("template", {}).get("spec") or {}]
    return []


def rename_configmap_references(resources, renames):
    for resource in resources:
        for pod in _pod_specs(resource):
            for volume in pod.get("volumes") or []:
                refs = [volume.get("configMap")]
                for source in (volume.get("projected") or {}).get("sources") or []:
                    refs.append(source.get("configMap"))
                for ref in refs:
                    if ref and ref.get("name") in renames:
                        ref["name"] = renames[ref["name"]]
            for container in ((pod.get("containers") or []) +
                              (pod.get("initContainers") or [])):
                for env in container.get("env") or []:
                    ref = (env.get("valueFrom") or {}).get("configMapKeyRef")
                    if ref and ref.get("name") in renames:
                        ref["name"] = renames[ref["name"]]
                for source in container.get("envFrom") or []:
                    ref = source.get("configMapRef")
                    if ref and ref.get("name") in renames:
                        ref["name"] = renames[ref["name"]]


def _accumulate(folder, resources, renames, expect_kind):
    """Runs FOLDER's kustomization over RESOURCES (appended to in place)."""
    path = _find_kustomization(folder)
    with open(path, "rb") as f:
        docs = _yaml_documents(f.read(), path)
    k = docs[0] if docs else {}
    if len(docs) > 1 or not isinstance(k, dict):
        _fail(path, "must hold one mapping")
    kind = k.get("kind", "Kustomization")
    if kind != expect_kind:
        _fail(path, "is a %s, expected a %s" % (kind, expect_kind))
    wanted_api = ("kustomize.config.k8s.io/v1beta1" if kind == "Kustomization"
                  else "kustomize.config.k8s.io/v1alpha1")
    if k.get("apiVersion", wanted_api) != wanted_api:
        _fail(path, "apiVersion must be %s" % wanted_api)
    unknown = set(k) - KUSTOMIZATION_FIELDS
    if unknown:
        _fail(path, "fields not implemented by this renderer: %s"
              % sorted(unknown))

    for entry in k.get("resources") or []:
        where = "%s: resource %s" % (path, entry)
        target = os.path.join(folder, entry)
        if os.path.isdir(target):
            sub, sub_renames = render(target)
            resources.extend(sub)
            renames.update(sub_renames)
        else:
            # Resource files, unlike generator files, may lie anywhere.
            if not os.path.isfile(target):
                _fail(where, "no such file or folder")
            with open(target, "rb") as f:
                for doc in _yaml_documents(f.read(), where):
                    if not isinstance(doc, dict) or "kind" not in doc:
                        _fail(where, "not a Kubernetes object")
                    resources.append(doc)

    for entry in k.get("components") or []:
        target = os.path.join(folder, entry)
        if not os.path.isdir(target):
            _fail(path, "component %s is not a folder" % entry)
        _accumulate(target, resources, renames, "Component")

    options = k.get("generatorOptions") or {}
    unknown = set(options) - GENERATOR_OPTION_FIELDS
    if unknown:
        _fail(path, "generatorOptions not implemented: %s" % sorted(unknown))
    for args in k.get("configMapGenerator") or []:
        configmap = _generate_configmap(folder, args, options, path)
        renames[args["name"]] = configmap["metadata"]["name"]
        resources.append(configmap)

    for patch in k.get("patches") or []:
        where = "%s: patch %s" % (path, patch.get("path"))
        if set(patch) - {"path", "target"} or "path" not in patch:
            _fail(where, "only patches with `path` and `target` are implemented")
        target = patch.get("target") or {}
        if set(target) - TARGET_FIELDS or not target:
            _fail(where, "target needs some of %s and nothing else"
                  % sorted(TARGET_FIELDS))
        operations = _yaml_documents(_load_inside(folder, patch["path"], where),
                                     where)
        if len(operations) != 1:
            _fail(where, "must hold one JSON patch")
        hits = [i for i, r in enumerate(resources) if _matches(r, target)]
        if not hits:
            _fail(where, "its target %s matches no resource" % target)
        for i in hits:
            resources[i] = apply_json_patch(resources[i], operations[0], where)

    rename_configmap_references(resources, renames)


def render(folder, components=()):
    """Renders FOLDER's kustomization, then COMPONENTS (folders) over it: what
    a kustomization with `resources: [FOLDER]` and `components: COMPONENTS`
    renders. Returns (resources, renames: generator name -> generated name)."""
    resources, renames = [], {}
    _accumulate(folder, resources, renames, "Kustomization")
    for component in components:
        _accumulate(component, resources, renames, "Component")
    rename_configmap_references(resources, renames)
    seen = set()
    for r in resources:
        key = (r.get("apiVersion"), r.get("kind"), r.get("metadata", {}).get("name"))
        if key in seen:
            _fail(folder, "two resources are %s %s %s" % key)
        seen.add(key)
    return resources, renames


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--component", action="append", default=[])
    args = parser.parse_args()
    try:
        resources, _ = render(args.folder, args.component)
    except RenderError as e:
        print("kustomize_lite: %s" % e, file=sys.stderr)
        return 1
    yaml.safe_dump_all(resources, sys.stdout, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
