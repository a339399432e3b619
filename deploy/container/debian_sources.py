#!/usr/bin/python3
"""The Debian mirror this machine's apt actually uses, for the container base.

usage: debian_sources.py mirror   prints the URI that serves suite SUITE
                                  (debootstrap's MIRROR argument)
       debian_sources.py deb822   prints a deb822 sources file for the image:
                                  every enabled entry of this machine for
                                  SUITE and SUITE-* (updates, security), with
                                  the Debian archive keyring of the image

SUITE is bookworm unless the environment says ATTN_DEBIAN_SUITE. The mirror
may be a proxy or a local mirror rather than deb.debian.org: the container's
apt must reach what this machine reaches. Reads /etc/apt/sources.list and
/etc/apt/sources.list.d/*.list (one-line form) and *.sources (deb822 form);
files with other suffixes (*.disabled, *.save) are ignored, as apt ignores
them. Exits 1 with a message when no entry serves SUITE.
"""
import glob
import os
import sys

SUITE = os.environ.get("ATTN_DEBIAN_SUITE", "bookworm")
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def one_line_entries(path):
    """Yields (uri, suite, components) of the `deb` lines of a .list file."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line.startswith("deb "):
                continue  # deb-src and blank lines
            rest = line[4:].strip()
            if rest.startswith("["):  # [arch=amd64 signed-by=...]
                rest = rest[rest.index("]") + 1:].strip()
            fields = rest.split()
            if len(fields) >= 3:
                yield fields[0], fields[1], fields[2:]


def deb822_entries(path):
    """Yields (uri, suite, components) of the enabled `deb` stanzas."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for stanza in text.split("\n\n"):
        fields, key = {}, None
        for line in stanza.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0] in " \t" and key:  # continuation line
                fields[key] += " " + line.strip()
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        components = fields.get("components", "").split()
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                yield uri, suite, components


def entries():
    """(uri, suite, components) of every enabled deb entry, in apt's order."""
    paths = []
    if os.path.exists("/etc/apt/sources.list"):
        paths.append("/etc/apt/sources.list")
    paths += sorted(glob.glob("/etc/apt/sources.list.d/*.list") +
                    glob.glob("/etc/apt/sources.list.d/*.sources"))
    for path in paths:
        read = deb822_entries if path.endswith(".sources") else one_line_entries
        yield from read(path)


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("mirror", "deb822"):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    ours = [(uri.rstrip("/"), suite, components)
            for uri, suite, components in entries()
            if suite == SUITE or suite.startswith(SUITE + "-")]
    main_uris = [uri for uri, suite, _ in ours if suite == SUITE]
    if not main_uris:
        print(f"debian_sources.py: no enabled apt source serves {SUITE} "
              "(looked in /etc/apt/sources.list and sources.list.d)",
              file=sys.stderr)
        return 1
    if sys.argv[1] == "mirror":
        print(main_uris[0])
        return 0
    # One stanza per URI, its suites and components merged in order.
    stanzas = {}
    for uri, suite, components in ours:
        suites, comps = stanzas.setdefault(uri, ([], []))
        suites += [s for s in [suite] if s not in suites]
        comps += [c for c in components if c not in comps]
    print("\n\n".join(
        f"Types: deb\nURIs: {uri}\nSuites: {' '.join(suites)}\n"
        f"Components: {' '.join(comps)}\nSigned-By: {KEYRING}"
        for uri, (suites, comps) in stanzas.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
