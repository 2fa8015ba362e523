"""Bounded readers (issues 53 items 10-12 and 54's "Bounded readers"): the kernel-tree check, the read loop at its
limit, the byte order mark, FIFOs opened without waiting, patch files, the build state and step timings, the venv
journal, image documents, and `index build`'s versions, CUDA text and the aside folder."""

from __future__ import annotations

from run_mutations import PKG, Mutation

SAFELOAD = ("tests/unit/util/test_safeload.py",)
STATE = ("tests/unit/builder/test_build_state_bounded.py",)
JOURNAL = ("tests/unit/overlay/test_venv_journal_bounded.py",)
PATCHES = ("tests/unit/series/test_series_patch_bounded.py", "tests/unit/util/test_safeload.py")
IMAGE = ("tests/unit/image/test_image_documents_bounded.py",)
PUBLISH = ("tests/integration/index/test_index_publish.py",)
FIFO = ("tests/unit/util/test_safeload.py", "tests/unit/recipes/test_recipe_inputs_bounded.py")

M = Mutation
MUTATIONS: tuple[Mutation, ...] = (
    # --- safeload ------------------------------------------------------------------------------------------------
    M("rd-prefix-no-separator", f"{PKG}/util/safeload.py", 'real.startswith(root + "/")', "real.startswith(root)",
      SAFELOAD, "/system, /sysroot and /devel are ordinary folders, not /sys or /dev"),
    M("rd-loop-truncates", f"{PKG}/util/safeload.py", "min(1 << 20, limit + 1 - size)", "min(1 << 20, limit - size)",
      SAFELOAD, "a reader at its limit refuses instead of cutting the file short"),
    M("rd-loop-no-refusal", f"{PKG}/util/safeload.py", "return None if size > limit else b\"\".join(chunks)",
      'return b"".join(chunks)[:limit]', SAFELOAD, "more than the limit is refused, never truncated"),
    M("rd-no-size-precheck", f"{PKG}/util/safeload.py", "        if info.st_size > limit:\n",
      "        if False:\n", SAFELOAD, "a file over its limit is refused by its size, naming it"),
    M("rd-bom-json", f"{PKG}/util/safeload.py", 'text = raw.decode("utf-8-sig")', 'text = raw.decode("utf-8")',
      SAFELOAD, "a JSON config saved with Notepad's byte order mark is read"),
    # (yamlsafe's decode as utf-8-sig is no mutation here: PyYAML itself skips a leading BOM, so both read alike)
    M("rd-fifo-blocks", f"{PKG}/util/safeload.py", 'flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) |',
      "flags = os.O_RDONLY |", FIFO, "a FIFO is opened without waiting for a writer (the test fails, not hangs)"),
    M("rd-fifo-read", f"{PKG}/util/safeload.py", "        if not stat.S_ISREG(info.st_mode):\n",
      "        if stat.S_ISDIR(info.st_mode):\n", FIFO, "a FIFO or device is refused, not read"),
    M("rd-patch-unbounded", f"{PKG}/util/safeload.py",
      '    return read_regular(path, MAX_PATCH_BYTES, "a patch file", error=error)',
      "    return path.read_bytes()", PATCHES, "a patch file is read bounded (size, FIFO, device)"),
    # --- patch readers -------------------------------------------------------------------------------------------
    M("rd-series-patch-plain", f"{PKG}/series/model.py", "        return read_patch(self.path)",
      "        return self.path.read_bytes()", PATCHES, "a series patch is read bounded when read, not only loaded"),
    M("rd-overlay-patch-plain", f"{PKG}/series/scratch.py", "        return read_patch(self.path)",
      "        return self.path.read_bytes()", PATCHES, "an overlay's patch file is read bounded"),
    M("rd-fixup-by-path", f"{PKG}/source/forkport.py", "        data = read_patch(patch)  #",
      "        data = patch.read_bytes()  #", PATCHES, "a fork fixup is read bounded before git applies it"),
    # --- build state and timings ---------------------------------------------------------------------------------
    M("rd-state-negative", f"{PKG}/builder/state.py", "not 0 <= value <= MAX_STEP_SECONDS",
      "not value <= MAX_STEP_SECONDS", STATE, "a negative step timing is refused"),
    M("rd-state-bool", f"{PKG}/builder/state.py", "if isinstance(value, bool) or not isinstance", "if not isinstance",
      STATE, "true is no number of seconds"),
    M("rd-state-digest-type", f"{PKG}/builder/state.py",
      "    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):", "    if False:", STATE,
      "a step's digest must be hex text"),
    M("rd-seconds-any-text", f"{PKG}/emit/manifest_info.py", "not _SECONDS.fullmatch(text)", "not text",
      STATE, "a .seconds marker holds a plain count of seconds (no nan, 1e999, words or other scripts' digits)"),
    M("rd-seconds-unchecked", f"{PKG}/emit/manifest_info.py",
      "        if (problem := seconds_problem(value)) is not None:", "        if (problem := None) is not None:",
      STATE, "a .seconds marker over a month is refused"),
    M("rd-seconds-plain-read", f"{PKG}/emit/manifest_info.py",
      '        raw = read_regular(marker, SECONDS_MAX_BYTES, "a step\'s timing")', "        raw = marker.read_bytes()",
      STATE, "a .seconds marker that is a FIFO or /dev/zero is refused without hanging"),
    # --- venv journal --------------------------------------------------------------------------------------------
    M("rd-journal-json-loads", f"{PKG}/overlay/venvjournal.py",
      '        raw = read_json(path, JOURNAL_MAX_BYTES, "the journal g4build writes", error=ValidationError)',
      "        raw = json.loads(path.read_bytes())", JOURNAL, "the journal is read bounded (depth, size, FIFO)"),
    M("rd-journal-hash-any", f"{PKG}/overlay/venvjournal.py",
      "    if value is None or (isinstance(value, str) and _SHA256.fullmatch(value)):", "    if True:", JOURNAL,
      "a journal's hashes are sha256 text or null"),
    # --- image documents -----------------------------------------------------------------------------------------
    M("rd-image-json-plain", f"{PKG}/image/sources.py",
      '    return loads_json(data, f"{bundle.name}: {rel}", error=ImageError)',
      '    return __import__("json").loads(data)', IMAGE, "an image's JSON documents are bounded in depth and numbers"),
    # --- index build ---------------------------------------------------------------------------------------------
    M("rd-index-version-text", f"{PKG}/index/site.py", "key = (name.project, Version(str(name.version)), tag.lower())",
      "key = (name.project, str(name.version), tag.lower())", PUBLISH, "0.21.0 and 0.21.0.0 are one version"),
    M("rd-index-cuda-unicode", f"{PKG}/index/entry.py",
      '_CUDA = re.compile(r"[0-9]{1,3}\\.[0-9]{1,3}(?:\\.[0-9]{1,4})?", re.ASCII)',
      '_CUDA = re.compile(r"\\d{1,3}\\.\\d{1,3}(?:\\.\\d{1,4})?")', PUBLISH,
      "a CUDA version of other scripts' digits never reaches the pages"),
    M("rd-index-aside-becomes-out", f"{PKG}/index/site.py",
      "    if not os.path.lexists(out):\n        return (",
      "    if not os.path.lexists(out):\n        os.rename(aside, out)\n        return (", PUBLISH,
      "a folder at the aside name beside a missing --out never becomes --out when the build fails"),
)
