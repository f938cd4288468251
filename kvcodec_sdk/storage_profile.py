"""Storage-aware tuning of the disk tier: the device class behind a directory, and the I/O
settings that class gets when a :class:`~kvcodec_sdk.DiskTierConfig` leaves them to the SDK.

The class comes from the mount table (``/proc/self/mountinfo``: the file system type and, for
NFS, its ``wsize``) and, for a local block device, from sysfs (``/sys/dev/block/MAJ:MIN``: an
NVMe namespace, a virtual disk, a rotational disk, or another solid-state device; partitions, device-mapper and
md devices resolve to the disks below them). The rules, one row per class:

========== ========= ========== =========== ========== ==========================================
class      io_mode   io_threads queue_depth io_backend why
========== ========= ========== =========== ========== ==========================================
nvme       auto      32         8           auto       deep device queues: O_DIRECT (``auto``
                                                       tries it), many requests in flight,
                                                       io_uring where the kernel allows it (the
                                                       H200 host's figures: reads at the
                                                       sequential ceiling)
ssd        buffered  8          4           threads    SATA/SAS queues hold 32 commands; the page
                                                       cache merges small writes
hdd        buffered  4          2           threads    seeks: more concurrency only reorders the
                                                       head
network    buffered  16         4           threads    NFS, SMB, Lustre, WekaFS...: parallel RPCs
                                                       hide the round trip; O_DIRECT is often
                                                       refused or slow
memory     buffered  4          1           threads    tmpfs/ramfs: a memcpy per page, O_DIRECT
                                                       unsupported
virtual    auto      32         8           auto       virtio/Xen disks (``vd*``, ``xvd*``): the
                                                       hypervisor reports them rotational whatever
                                                       backs them, usually networked SSDs where
                                                       depth pays
unknown    auto      32         8           threads    overlay and anything unrecognised
========== ========= ========== =========== ========== ==========================================

A ``wsize`` below 1 MiB on NFS adds a warning with the remount command. Values set explicitly in
the config always win; :func:`probe_storage` never raises for an unreadable sysfs or mount table
(the class is then ``unknown``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["DEVICE_CLASSES", "StorageProfile", "probe_storage", "NFS_MIN_WSIZE"]

#: Per device class: (io_mode, io_threads, queue_depth, io_backend).
DEVICE_CLASSES: dict[str, tuple[str, int, int, str]] = {
    "nvme": ("auto", 32, 8, "auto"),
    "ssd": ("buffered", 8, 4, "threads"),
    "hdd": ("buffered", 4, 2, "threads"),
    "network": ("buffered", 16, 4, "threads"),
    "memory": ("buffered", 4, 1, "threads"),
    "virtual": ("auto", 32, 8, "auto"),
    "unknown": ("auto", 32, 8, "threads"),
}

#: An NFS mount writing less than this per RPC gets a warning (and the remount command).
NFS_MIN_WSIZE = 1 << 20

_NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "gpfs", "beegfs",
               "wekafs", "9p", "afs", "ocfs2", "gfs2"}
_MEMORY_FS = {"tmpfs", "ramfs", "hugetlbfs"}


@dataclass(frozen=True)
class StorageProfile:
    """What :func:`probe_storage` found for a directory, and the settings its class gets.

    :param path: The directory probed (its nearest existing ancestor when it does not exist yet).
    :param device_class: One of :data:`DEVICE_CLASSES`.
    :param fs_type: The file system type from the mount table ("" when unknown).
    :param mount_point: The mount the path is on ("" when unknown).
    :param block_devices: The disks behind a local file system (``nvme0n1``, ``sda``...), resolved
        through partitions, device-mapper and md.
    :param nfs_wsize: The NFS mount's ``wsize`` in bytes, or None.
    :param io_mode: The class's ``io_mode``.
    :param io_threads: The class's I/O threads per region.
    :param queue_depth: The class's io_uring requests in flight per thread.
    :param io_backend: The class's ``io_backend`` (``"auto"``: io_uring where the kernel allows it).
    :param warnings: Things an operator should fix (a low NFS ``wsize``, with the command).
    """

    path: str
    device_class: str
    fs_type: str = ""
    mount_point: str = ""
    block_devices: tuple[str, ...] = ()
    nfs_wsize: int | None = None
    io_mode: str = "auto"
    io_threads: int = 32
    queue_depth: int = 8
    io_backend: str = "threads"
    warnings: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        """One line for logs and reports: class, file system, devices and the settings."""
        where = f"{self.fs_type or '?'} on {self.mount_point or '?'}"
        if self.block_devices:
            where += f" ({', '.join(self.block_devices)})"
        return (f"{self.device_class}: {where}; io_mode {self.io_mode}, {self.io_threads} I/O threads, "
                f"io_backend {self.io_backend}, queue depth {self.queue_depth}")


def _existing(path: str) -> str:
    p = os.path.abspath(os.fspath(path))
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return os.path.realpath(p)


def _unescape(field_text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...).
    out, i = [], 0
    while i < len(field_text):
        if field_text[i] == "\\" and len(field_text) >= i + 4 and field_text[i + 1:i + 4].isdigit():
            out.append(chr(int(field_text[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field_text[i])
            i += 1
    return "".join(out)


def _mount_of(path: str, mountinfo: str) -> tuple[str, str, str, str]:
    """(mount point, fs type, device major:minor, super options) of the longest mount containing
    ``path``; empty strings when the table cannot be read."""
    best = ("", "", "", "")
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return best
    for line in lines:
        left, sep, right = line.partition(" - ")
        parts, rest = left.split(), right.split()
        if not sep or len(parts) < 5 or len(rest) < 2:
            continue
        mount = _unescape(parts[4])
        inside = path == mount or path.startswith(mount.rstrip("/") + "/") or mount == "/"
        if inside and len(mount) >= len(best[0]):
            best = (mount, rest[0], parts[2], rest[2] if len(rest) > 2 else "")
    return best


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def _disks(sys_root: str, devnum: str) -> list[str]:
    """The whole disks behind block device ``devnum`` (MAJ:MIN): a partition's parent, the
    slaves of a device-mapper or md device, recursively."""
    link = os.path.join(sys_root, "dev", "block", devnum)
    if not os.path.exists(link):
        return []
    dev = os.path.realpath(link)
    seen: list[str] = []

    def walk(d: str, depth: int) -> None:
        if depth > 8:
            return
        if os.path.exists(os.path.join(d, "partition")):
            d = os.path.dirname(d)
        slaves = os.path.join(d, "slaves")
        below = sorted(os.listdir(slaves)) if os.path.isdir(slaves) else []
        if below:
            for s in below:
                walk(os.path.realpath(os.path.join(slaves, s)), depth + 1)
        elif os.path.basename(d) not in seen:
            seen.append(os.path.basename(d))

    walk(dev, 0)
    return seen


def _class_of_disks(sys_root: str, disks: list[str]) -> str:
    classes = set()
    for name in disks:
        if name.startswith("nvme"):
            classes.add("nvme")
            continue
        if name.startswith(("vd", "xvd")):
            classes.add("virtual")
            continue
        rot = _read(os.path.join(sys_root, "block", name, "queue", "rotational"))
        if rot is None:
            classes.add("unknown")
        else:
            classes.add("hdd" if rot == "1" else "ssd")
    # A volume spanning classes is as slow as its slowest member.
    for c in ("hdd", "ssd", "unknown", "virtual", "nvme"):
        if c in classes:
            return c
    return "unknown"


def probe_storage(path: str | os.PathLike, *, sys_root: str = "/sys",
                  mountinfo: str = "/proc/self/mountinfo") -> StorageProfile:
    """The device class of the storage holding ``path`` and the settings of that class.

    ``sys_root`` and ``mountinfo`` name where sysfs and the mount table are read (tests point
    them at fixtures). Never raises for unreadable system files: the class is then ``unknown``.
    """
    where = _existing(os.fspath(path))
    mount, fs, devnum, options = _mount_of(where, mountinfo)
    disks: list[str] = []
    wsize = None
    notes: list[str] = []
    fs_base = fs.split(".", 1)[0]
    if fs in _NETWORK_FS or fs_base in _NETWORK_FS or fs.startswith("fuse."):
        device_class = "network"
        if fs_base in ("nfs", "nfs4"):
            for opt in options.split(","):
                if opt.startswith("wsize="):
                    try:
                        wsize = int(opt.split("=", 1)[1])
                    except ValueError:
                        wsize = None
            if wsize is not None and wsize < NFS_MIN_WSIZE:
                notes.append(f"NFS mount {mount} writes {wsize} bytes per RPC (wsize); page writes are split into "
                             f"{-(-NFS_MIN_WSIZE // wsize)}x more round trips than needed: remount with "
                             f"`mount -o remount,wsize={NFS_MIN_WSIZE},rsize={NFS_MIN_WSIZE} {mount}`")
    elif fs in _MEMORY_FS:
        device_class = "memory"
    else:
        try:
            st_dev = os.stat(where).st_dev
            devnum = f"{os.major(st_dev)}:{os.minor(st_dev)}"
        except OSError:
            pass
        disks = _disks(sys_root, devnum) if devnum else []
        device_class = _class_of_disks(sys_root, disks) if disks else "unknown"
    io_mode, threads, depth, backend = DEVICE_CLASSES[device_class]
    return StorageProfile(where, device_class, fs, mount, tuple(disks), wsize, io_mode, threads, depth, backend,
                          tuple(notes))
