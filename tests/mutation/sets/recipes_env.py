"""The recipe environment, the wheel's manifest, the per-pin env names, project discovery and the MoE and choice
rules (issue 53 items 6-9, issue 54's clusters "Project discovery", "The env policy", "Recipe rules and choices"):
one realistic one-line bug each, held by offline tests."""

from __future__ import annotations

from run_mutations import PKG, Mutation

M = Mutation
POLICY = ("tests/unit/recipes/test_recipe_env_policy.py",)
WHEEL = ("tests/unit/recipes/test_recipe_rules.py", "tests/unit/recipes/test_recipe_wheel_manifest_and_caches.py")
OWN = ("tests/unit/test_project_discovery.py",)
CHOICES = ("tests/unit/recipes/test_recipe_rules.py", "tests/unit/recipes/test_recipe_args_generator.py",
           "tests/unit/recipes/test_recipe_pin_and_choices.py")
_POLICY = f"{PKG}/recipes/env_policy.py"

MUTATIONS: tuple[Mutation, ...] = (
    # --- the env policy ----------------------------------------------------------------------------------------
    M("env-case-sensitive", _POLICY, "        upper = name.upper()\n        return (",
      "        upper = name\n        return (", POLICY, "names compare case-insensitively (`Path` is PATH on Windows)"),
    M("env-allow-env-case", _POLICY, "        out.add(value.upper())", "        out.add(value)", POLICY,
      "--allow-env takes a name in any case"),
    M("env-policy-entries-case", _POLICY, "        lists[key] = [i.upper() for i in items]",
      "        lists[key] = list(items)", POLICY, "lower-case entries in launch-env.yaml count"),
    M("env-policy-misspelled-key", _POLICY, "    _unknown_keys(data, _KEYS, str(path))\n", "", POLICY,
      "a misspelled top-level key in launch-env.yaml is an error, not ignored"),
    M("env-policy-misspelled-list", _POLICY, "    _unknown_keys(raw, _LIST_KEYS, where)\n", "", POLICY,
      "a misspelled list key (sufixes) in launch-env.yaml is an error"),
    M("env-policy-misspelled-pin", _POLICY, '        _unknown_keys(pins, known_pins, f"{path}.pins")\n',
      "        pass\n", POLICY, "a pins: entry for a pin pins.yaml does not know is an error"),
    M("env-deny-suffixes", _POLICY, " or upper.endswith(self.suffixes)", "", POLICY,
      "a path, cache or endpoint name (TRITON_PTXAS_PATH, HF_ENDPOINT) is denied by its suffix"),
    M("env-deny-contains", _POLICY, "\n                or any(part in upper for part in self.contains))", ")", POLICY,
      "an insecure switch (VLLM_ALLOW_INSECURE_SERIALIZATION) is denied"),
    M("env-allow-env-opens-deny", _POLICY, "        if self.deny.holds(name):",
      "        if self.deny.holds(name) and name.upper() not in asked:", POLICY,
      "--allow-env never opens the deny-list"),
    M("env-deny-launch-switch", "recipes/vllm-args/launch-env.yaml",
      "FLASHINFER_WORKSPACE_BASE, G4BUILD_ALLOW_ENVIRONMENT]", "FLASHINFER_WORKSPACE_BASE]", POLICY,
      "a recipe cannot turn off the launch's own environment check"),
    M("env-case-duplicates", f"{PKG}/recipes/model.py",
      "same = next((k for k in env if k.upper() == key.upper()), None)",
      "same = next((k for k in env if k == key), None)", POLICY,
      "two spellings of one variable (Windows) are refused"),
    M("env-vllm-name-case", f"{PKG}/recipes/env_names.py", "        if name.upper() in ctx.vllm_envs:",
      "        if False:", POLICY, "a VLLM_ name in another case is named by vLLM's spelling"),
    M("env-allowed-name-case", f"{PKG}/recipes/env_names.py",
      "        elif name != name.upper() and not name.upper().startswith(VLLM_PREFIX):", "        elif False:",
      POLICY, "an allowed name in lower case (read on Windows only) is named by its spelling"),
    # --- the wheel's own manifest ---------------------------------------------------------------------------------
    M("wheel-first-manifest", f"{PKG}/recipes/context.py",
      "            dist = _own_dist_info(names, *_wheel_name(wheel.name), wheel.name)",
      "            dist = next((n.rsplit('/', 1)[0] for n in sorted(names) if n.endswith('.dist-info/' + "
      "MANIFEST_NAME)), None)", WHEEL, "only the wheel's own dist-info's manifest is read, not the first at any depth"),
    M("wheel-dist-info-version", f"{PKG}/recipes/context.py", "            if Version(dist_version) == version:",
      "            if Version(dist_version) or version:", WHEEL,
      "the dist-info read is the one of the wheel's own version"),
    M("wheel-series-no-pin", f"{PKG}/recipes/rules.py",
      "ctx.wheel.series and not (ctx.wheel.pin and ctx.wheel.pin in ctx.known_pins):",
      "ctx.wheel.series and not ctx.wheel.series:", WHEEL, "series claimed by a manifest naming no pin are refused"),
    M("wheel-series-unknown-pin", f"{PKG}/recipes/rules.py",
      "ctx.wheel.series and not (ctx.wheel.pin and ctx.wheel.pin in ctx.known_pins):",
      "ctx.wheel.series and not ctx.wheel.pin:", WHEEL, "series claimed for an unknown pin are refused"),
    # --- the per-pin env names ------------------------------------------------------------------------------------
    M("envs-recorded-string", f"{PKG}/recipes/vllm_envs.py",
      "    if not isinstance(envs, list) or not all(", "    if envs is None or not all(", WHEEL,
      "a recorded or cached list that is a string is an error, not read letter by letter"),
    M("envs-cache-untyped", f"{PKG}/recipes/vllm_envs.py",
      '            return _typed_names(data, cached, "delete it: it is a cache, read again from the pin\'s sdist")',
      '            return frozenset(data["envs"])', WHEEL, "the user cache of env names is typed too"),
    # --- project discovery ----------------------------------------------------------------------------------------
    M("own-linked-folders", f"{PKG}/data.py", 'entries = _tree(data) if name != "ci"',
      'entries = [data, *data.rglob("*")] if name != "ci"', OWN,
      "linked folders under patches/ and recipes/ are entered and checked"),
    M("own-linked-top-only", f"{PKG}/data.py", "        todo += [c for c in children if c.is_dir()]\n", "", OWN,
      "every level under recipes/ is checked, not only the top"),
    M("own-group-members", f"{PKG}/data.py", "    return group == user and members <= {user}",
      "    return group == user", OWN, "a group named like the user with other members is not private"),
    M("own-cwd-candidate", f"{PKG}/data.py", "    for folder in (here, *here.parents):",
      "    for folder in here.parents:", OWN, "the working directory itself is a project candidate"),
    M("own-doctor-silent", f"{PKG}/cli/doctor.py", "    if skipped is not None:", "    if False:", OWN,
      "doctor names the project passed over and why"),
    # --- recipe rules and choices ---------------------------------------------------------------------------------
    M("moe-no-dash-fold", f"{PKG}/recipes/moe_backend.py", "normalized(value.strip(), LOWER_UNDERSCORE)",
      "value.strip().lower()", CHOICES, "flashinfer-cutedsl is refused as flashinfer_cutedsl is"),
    M("moe-row-drop-021", f"{PKG}/recipes/moe_backend.py",
      '"vllm-0.21.0": ("cutlass", "flashinfer_cutedsl", "flashinfer_cutlass", "flashinfer_trtllm"),',
      '"vllm-0.21.0": ("cutlass", "flashinfer_cutlass", "flashinfer_trtllm"),', CHOICES,
      "each value of a pin's MoE row is refused (offline)"),
    M("moe-row-drop-033", f"{PKG}/recipes/moe_backend.py",
      '"vllm-0.33.0": ("b12x", "flashinfer_cutedsl", "flashinfer_moe_ep_cutedsl"),',
      '"vllm-0.33.0": ("b12x", "flashinfer_cutedsl"),', CHOICES, "each value of a pin's MoE row is refused (offline)"),
    M("choices-no-dash-fold", f"{PKG}/recipes/vllm_choices.py",
      'return value.lower().replace("-", "_") if convert == LOWER_UNDERSCORE else value',
      "return value.lower() if convert == LOWER_UNDERSCORE else value", CHOICES,
      "a --moe-backend choice is folded '-' to '_' as vLLM folds it"),
    M("choices-fold-everywhere", f"{PKG}/recipes/vllm_choices.py",
      'return value.lower().replace("-", "_") if convert == LOWER_UNDERSCORE else value',
      'return value.lower().replace("-", "_")', CHOICES, "a choice is folded only where vLLM folds it"),
    M("generator-no-convert", f"{PKG}/recipes/vllm_args.py",
      '                        rule["convert"] = retyped[name]\n', "                        pass\n", CHOICES,
      "the generated table records vLLM's conversion of --moe-backend"),
)
