"""Route: a package index users install nightly wheels from with pip.

A folder of validated wheels becomes a static site: PEP 503 simple pages and their PEP 691 JSON twins, sha256
fragments on every link, each wheel's METADATA beside it (PEP 658), and a page per wheel saying which pin,
series, torch and CUDA it was made for (from its build-manifest.json). Names and versions come from the wheels
and are untrusted: they are parsed with ``packaging`` and checked before they become a path, a URL or HTML.
"""
