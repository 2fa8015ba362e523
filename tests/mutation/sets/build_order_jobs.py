"""Long units first and MAX_JOBS from the measured memory per nvcc job (issue 50, points 1 and 3)."""

from run_mutations import PKG, Mutation

ORDER = ("tests/unit/builder/test_build_order.py", "tests/unit/builder/test_build_unit_costs_script.py")
JOBS = ("tests/unit/builder/test_build_jobs.py", "tests/unit/doctor/test_doctor_recorded.py")

MUTATIONS: tuple[Mutation, ...] = (
    Mutation("order-nothing-moved", f"{PKG}/builder/ninjaorder.py",
             "    known.sort(key=lambda k: (k[0], k[1]))\n",
             "    known.sort(key=lambda k: (k[0], k[1]))\n    known = []\n",
             ORDER, "the recorded long units stay where CMake wrote them: they start last"),
    Mutation("order-shortest-first", f"{PKG}/builder/ninjaorder.py",
             "known.sort(key=lambda k: (k[0], k[1]))", "known.sort(key=lambda k: (-k[0], k[1]))",
             ORDER, "the recorded units are moved shortest first"),
    Mutation("order-past-a-variable", f"{PKG}/builder/ninjaorder.py",
             'b.kind in (*_ENV_CHANGING, "var")), default=-1)', 'b.kind in _ENV_CHANGING), default=-1)',
             ORDER, "a build statement is moved above a variable it may read"),
    Mutation("order-new-mtime", f"{PKG}/builder/ninjaorder.py",
             "        os.utime(tmp, ns=(stat.st_atime_ns, stat.st_mtime_ns))", "        pass",
             ORDER, "the rewritten build.ninja looks new: ninja may run CMake again"),
    Mutation("jobs-no-margin", f"{PKG}/builder/buildcosts.py",
             "return self.peak_gb / self.at_jobs * self.margin", "return self.peak_gb / self.at_jobs",
             JOBS, "MAX_JOBS counts the bare average per job: the heavy units running together run out of memory"),
    Mutation("jobs-not-bound-by-cores", f"{PKG}/builder/buildcosts.py",
             "jobs = max(1, by_mem if cores is None else min(cores, by_mem))", "jobs = max(1, by_mem)",
             JOBS, "more nvcc jobs than cores"),
    Mutation("jobs-figure-unused", f"{PKG}/builder/request.py",
             "default_jobs, launcher, cuda_home = machine_choices(target, host, costs)",
             "default_jobs, launcher, cuda_home = machine_choices(target, host)",
             JOBS, "the wheel's MAX_JOBS ignores the measured figure"),
)
