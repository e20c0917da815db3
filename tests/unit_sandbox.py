#!/usr/bin/env python3
"""Runs a command under the sandbox a systemd unit file describes, where systemd cannot
(no systemd as PID 1, so no `systemd-run`). Used by systemd_units_test.sh.

Applied from the unit's [Service] section, as systemd applies them:
  SystemCallFilter= (groups expanded by `systemd-analyze syscall-filter`), SystemCallErrorNumber=,
  SystemCallArchitectures=native, RestrictAddressFamilies=, RestrictNamespaces=yes,
  RestrictRealtime=, LockPersonality=, MemoryDenyWriteExecute= (all as one seccomp filter, loaded
  with libseccomp); NoNewPrivileges=; CapabilityBoundingSet= (empty: all dropped); UMask=;
  ProtectProc= and ProcSubset= (a fresh /proc mount with hidepid= and subset=, in a private mount
  namespace); PrivateDevices=yes (a /dev holding only null, zero, full, random, urandom, tty and
  an empty shm); User=/Group= (replaced by --uid/--gid: the unit's own user need not exist here).
Not applied: file-system visibility (ProtectSystem=, ProtectHome=, ReadWritePaths=, PrivateTmp=),
cgroup device lists (DeviceAllow=), PrivateUsers=, PrivateMounts= and the rest: they decide what
the process can see, not which kernel interfaces it may use.

Usage (as root; the command keeps this process's PID, so a caller can signal it):
  unit_sandbox.py --unit=<file.service> --uid=N --gid=N -- <command> [args...]
Exit status: the command's; 2 for a usage error; 3 when the sandbox cannot be set up (the reason
on stderr).
"""

import argparse
import ctypes
import ctypes.util
import errno
import os
import subprocess
import sys

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ = 4
SCMP_CMP_GE = 5
SCMP_CMP_MASKED_EQ = 7
AF_MAX = 46  # Linux 6.x; every family number from here on is refused too
FAMILIES = {"AF_UNIX": 1, "AF_LOCAL": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16,
            "AF_PACKET": 17, "AF_VSOCK": 40}
CLONE_NAMESPACE_FLAGS = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 |
                         0x20000000 | 0x40000000 | 0x00000080)  # NEWNS, CGROUP, UTS, IPC, USER, PID, NET, TIME
SCHED_OTHER, SCHED_BATCH, SCHED_IDLE, SCHED_RESET_ON_FORK = 0, 3, 5, 0x40000000
PROT_WRITE, PROT_EXEC = 0x2, 0x4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38


class ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


def die(message):
    print(f"unit_sandbox: {message}", file=sys.stderr)
    sys.exit(3)


def errno_action(number):
    return 0x00050000 | (number & 0xFFFF)


def service_settings(path):
    """The [Service] section's settings: name -> list of values, in order."""
    settings, section = {}, None
    with open(path, encoding="utf-8") as unit:
        for raw in unit:
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line
                continue
            if section == "[Service]" and "=" in line:
                name, value = line.split("=", 1)
                settings.setdefault(name.strip(), []).append(value.strip())
    return settings


def expand_group(group, seen=None):
    """The system calls of one systemd syscall group, nested groups expanded."""
    seen = set() if seen is None else seen
    if group in seen:
        return set()
    seen.add(group)
    out = subprocess.run(["systemd-analyze", "syscall-filter", group], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        die(f"systemd-analyze syscall-filter {group} failed: {out.stderr.strip()}")
    calls = set()
    for line in out.stdout.splitlines()[1:]:
        for word in line.split("#", 1)[0].split():
            calls |= expand_group(word, seen) if word.startswith("@") else {word}
    return calls


def allowed_calls(values):
    """The system calls the unit's SystemCallFilter= lines allow (an allow list less denials)."""
    allowed, denied = set(), set()
    for value in values:
        deny = value.startswith("~")
        for item in value.lstrip("~").split():
            calls = expand_group(item) if item.startswith("@") else {item}
            (denied if deny else allowed).update(calls)
    return allowed - denied


class Filter:
    def __init__(self, default_errno):
        self.lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2",
                               use_errno=True)
        self.lib.seccomp_init.restype = ctypes.c_void_p
        self.lib.seccomp_init.argtypes = [ctypes.c_uint32]
        self.lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32,
                                                    ctypes.c_int, ctypes.c_uint,
                                                    ctypes.POINTER(ArgCmp)]
        self.lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        self.lib.seccomp_load.argtypes = [ctypes.c_void_p]
        # Unlisted calls, and every non-native ABI (libseccomp's default), are refused.
        self.ctx = self.lib.seccomp_init(errno_action(default_errno))
        if not self.ctx:
            die("seccomp_init failed")

    def number(self, name):
        nr = self.lib.seccomp_syscall_resolve_name(name.encode())
        return nr if nr >= 0 else None  # unknown here, or not on this architecture

    def add(self, action, name, *conditions):
        nr = self.number(name)
        if nr is None:
            return
        array = (ArgCmp * max(1, len(conditions)))(*[ArgCmp(*c) for c in conditions])
        rc = self.lib.seccomp_rule_add_array(self.ctx, action, nr, len(conditions), array)
        if rc != 0:
            die(f"seccomp rule for {name} {conditions}: error {-rc}")

    def load(self):
        rc = self.lib.seccomp_load(self.ctx)
        if rc != 0:
            die(f"seccomp_load: error {-rc}")


def build_filter(settings):
    filters = settings.get("SystemCallFilter", [])
    if not filters or filters[0].startswith("~"):
        die("the unit has no SystemCallFilter= allow list (the only form this emulates)")
    allowed = allowed_calls(filters)
    number = settings.get("SystemCallErrorNumber", ["EPERM"])[-1]
    default_errno = getattr(errno, number, None)
    if default_errno is None:
        die(f"SystemCallErrorNumber={number}: not an errno name")
    if settings.get("SystemCallArchitectures", [""])[-1] not in ("native", ""):
        die("only SystemCallArchitectures=native is emulated")
    seccomp = Filter(default_errno)
    special = set()
    yes = lambda name: settings.get(name, ["no"])[-1] in ("yes", "true", "1", "on")

    families = settings.get("RestrictAddressFamilies", [])
    if families and "socket" in allowed:
        special.add("socket")
        names = " ".join(families).split()
        if names[0].startswith("~"):
            die("only an allow list of RestrictAddressFamilies= is emulated")
        allow = {FAMILIES[n] for n in names if n in FAMILIES}
        for family in range(AF_MAX):
            action = SCMP_ACT_ALLOW if family in allow else errno_action(errno.EAFNOSUPPORT)
            seccomp.add(action, "socket", (0, SCMP_CMP_EQ, family, 0))
        seccomp.add(errno_action(errno.EAFNOSUPPORT), "socket", (0, SCMP_CMP_GE, AF_MAX, 0))

    if yes("RestrictNamespaces"):
        # As systemd does: clone3's flags sit in memory a filter cannot read, so it answers
        # ENOSYS and the C library falls back to clone, whose flags it checks.
        special |= {"clone", "clone3", "unshare", "setns"}
        seccomp.add(errno_action(errno.ENOSYS), "clone3")
        seccomp.add(SCMP_ACT_ALLOW, "clone", (0, SCMP_CMP_MASKED_EQ, CLONE_NAMESPACE_FLAGS, 0))

    if yes("RestrictRealtime") and "sched_setscheduler" in allowed:
        special.add("sched_setscheduler")
        for policy in (SCHED_OTHER, SCHED_BATCH, SCHED_IDLE):
            for flag in (0, SCHED_RESET_ON_FORK):
                seccomp.add(SCMP_ACT_ALLOW, "sched_setscheduler", (1, SCMP_CMP_EQ, policy | flag, 0))

    if yes("LockPersonality") and "personality" in allowed:
        special.add("personality")
        for persona in (0, 0xFFFFFFFF):  # PER_LINUX, and the query
            seccomp.add(SCMP_ACT_ALLOW, "personality", (0, SCMP_CMP_EQ, persona, 0))

    if yes("MemoryDenyWriteExecute"):
        special |= {"mmap", "mprotect", "pkey_mprotect"}
        # As systemd does: no mapping both writable and executable, and no mprotect to executable.
        for prot in (0, PROT_WRITE, PROT_EXEC):
            seccomp.add(SCMP_ACT_ALLOW, "mmap", (2, SCMP_CMP_MASKED_EQ, PROT_WRITE | PROT_EXEC, prot))
        for call in ("mprotect", "pkey_mprotect"):
            seccomp.add(SCMP_ACT_ALLOW, call, (2, SCMP_CMP_MASKED_EQ, PROT_EXEC, 0))

    for name in sorted(allowed - special):
        seccomp.add(SCMP_ACT_ALLOW, name)
    return seccomp


def mount(*args):
    out = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        die(f"mount {' '.join(args)}: {out.stderr.strip()}")


def private_devices():
    """A /dev of pseudo devices only, as PrivateDevices=yes makes."""
    staging = "/run/unit_sandbox_dev" if os.path.isdir("/run") else "/mnt"
    os.makedirs(staging, exist_ok=True)
    mount("-t", "tmpfs", "-o", "mode=0755,nosuid,noexec", "tmpfs", staging)
    for node in ("null", "zero", "full", "random", "urandom", "tty"):
        if os.path.exists(f"/dev/{node}"):
            open(f"{staging}/{node}", "w", encoding="utf-8").close()
            mount("--bind", f"/dev/{node}", f"{staging}/{node}")
    os.mkdir(f"{staging}/shm")
    mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", f"{staging}/shm")
    mount("--move", staging, "/dev")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--unit", required=True)
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--gid", type=int, required=True)
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()
    if os.geteuid() != 0:
        die("needs root (it mounts /proc and changes user)")
    if not args.inner:
        # A private mount namespace first; `unshare` execs us again inside it, same PID.
        os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", sys.executable,
                              os.path.abspath(__file__), f"--unit={args.unit}",
                              f"--uid={args.uid}", f"--gid={args.gid}", "--inner", "--",
                              *args.command])
    settings = service_settings(args.unit)
    seccomp = build_filter(settings)
    protect_proc = settings.get("ProtectProc", ["default"])[-1]
    subset = settings.get("ProcSubset", ["all"])[-1]
    if protect_proc != "default" or subset != "all":
        options = [f"hidepid={protect_proc if protect_proc != 'default' else 'off'}"]
        if subset == "pid":
            options.append("subset=pid")
        mount("-t", "proc", "-o", ",".join(["nosuid", "nodev", "noexec", *options]), "proc",
              "/proc")
    if settings.get("PrivateDevices", ["no"])[-1] == "yes":
        private_devices()
    if "UMask" in settings:
        os.umask(int(settings["UMask"][-1], 8))
    libc = ctypes.CDLL(None, use_errno=True)
    if settings.get("CapabilityBoundingSet", ["x"])[-1] == "":
        for cap in range(64):
            if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
                die(f"dropping capability {cap}: {os.strerror(ctypes.get_errno())}")
    os.setgroups([])
    os.setgid(args.gid)
    os.setuid(args.uid)  # drops every remaining capability
    # NoNewPrivileges=yes; a process without CAP_SYS_ADMIN needs it to load a filter anyway.
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        die(f"no_new_privs: {os.strerror(ctypes.get_errno())}")
    seccomp.load()
    try:
        os.execvp(args.command[0], args.command)
    except OSError as error:
        print(f"unit_sandbox: cannot run {args.command[0]}: {error}", file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    main()
