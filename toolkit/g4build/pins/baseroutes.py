"""What a user can do for a pin that records no base tree for an OS: the routes that work without one.

A native Windows build starts from a Windows fork's tree (upstream's setup.py builds nothing on win32), and a pin
gets a ``bases.windows`` entry only once the fork's commit is verified. Until then ``wheel --os windows`` and
``source fetch --os windows`` refuse, and both say the same thing: which routes work today, each as a command
that runs as written (tests/unit/cli/test_first_hour.py runs them).
"""

from __future__ import annotations

from g4build.pins.model import Pin


def no_base_routes(pin: Pin, os_name: str, arch: str = "sm120") -> str:
    """The hint for ``pin`` without ``bases.<os_name>``: the routes that work instead, then how to add a base."""
    if os_name != "windows":
        return (f"drop --os for the upstream tree, or add bases.{os_name} to {pin.name} in patches/pins.yaml "
                "(the fork's remote and full commit)")
    return (
        f"routes that work today: overlay a Windows fork's {pin.version} wheel, no compile "
        f"(`g4build overlay vllm-{pin.version}+cu132-cp312-cp312-win_amd64.whl --pin {pin.name}`); build "
        f"in WSL (`g4build wheel --arch {arch} --os wsl --pin {pin.name}`); or build natively "
        "from a pin that has a Windows base (`g4build pins show NAME` lists its bases). To build this pin "
        f"natively, add bases.windows to {pin.name} in patches/pins.yaml: the fork's remote and the full "
        f"commit of its {pin.version} release (a release is used as it is: no onto/keep_pin), then "
        f"`g4build source fetch --pin {pin.name} --os windows` clones and verifies it"
    )
