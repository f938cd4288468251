"""Storage-aware tuning: the device class behind a directory, read from a mount table and sysfs
(fixtures laid out as the kernel does), and the I/O settings a disk tier gets from it."""

from __future__ import annotations

import logging
import os

import pytest
from test_kvcm_support import config, group

from kvcodec_sdk import DiskTierConfig, KVCacheManager
from kvcodec_sdk.storage_profile import DEVICE_CLASSES, NFS_MIN_WSIZE, StorageProfile, probe_storage


def mountinfo(tmp_path, rows):
    """A mountinfo file: one (mount point, fs type, MAJ:MIN, super options) per row."""
    lines = [f"{20 + i} 1 {dev} / {mp.replace(' ', chr(92) + '040')} rw,relatime shared:1 - {fs} src {opts}"
             for i, (mp, fs, dev, opts) in enumerate(rows)]
    path = tmp_path / "mountinfo"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def block(sys_root, name, rotational=None, parent=None, slaves=(), devnum=None):
    """sysfs for one block device: /sys/block/NAME (a partition lives under its parent), its
    queue/rotational, slaves/, and the /sys/dev/block/MAJ:MIN link."""
    base = sys_root / "devices" / "virtual" / "block"
    d = (base / parent / name) if parent else (base / name)
    d.mkdir(parents=True, exist_ok=True)
    if parent:
        (d / "partition").write_text("1\n")
    else:
        (sys_root / "block").mkdir(exist_ok=True)
        os.symlink(d, sys_root / "block" / name)
        if rotational is not None:
            (d / "queue").mkdir()
            (d / "queue" / "rotational").write_text(f"{rotational}\n")
    if slaves:
        (d / "slaves").mkdir()
        for s in slaves:
            os.symlink(base / s, d / "slaves" / s)
    if devnum:
        (sys_root / "dev" / "block").mkdir(parents=True, exist_ok=True)
        os.symlink(d, sys_root / "dev" / "block" / devnum)


def probe_local(tmp_path, sys_root, devnum, fs="ext4"):
    """Probes a path whose st_dev is mapped to ``devnum`` by the mount table (the probe prefers
    the path's real st_dev; here sysfs is keyed by it)."""
    st = os.stat(tmp_path)
    real = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    link = sys_root / "dev" / "block" / real
    target = os.readlink(sys_root / "dev" / "block" / devnum)
    if devnum != real:
        os.symlink(target, link)
    return probe_storage(tmp_path, sys_root=str(sys_root), mountinfo=mountinfo(tmp_path, [("/", fs, devnum, "rw")]))


@pytest.fixture
def sysfs(tmp_path):
    root = tmp_path / "sys"
    root.mkdir()
    return root


@pytest.mark.parametrize("name,rot,want", [("nvme0n1", 0, "nvme"), ("sda", 0, "ssd"), ("sdb", 1, "hdd"),
                                           ("vda", 1, "virtual")])
def test_a_local_disk_gets_its_class_through_the_partition(tmp_path, sysfs, name, rot, want):
    block(sysfs, name, rotational=rot)
    block(sysfs, name + ("p1" if name.startswith("nvme") else "1"), parent=name, devnum="259:1")
    data = tmp_path / "data"
    data.mkdir()
    p = probe_local(data, sysfs, "259:1")
    assert p.device_class == want and p.block_devices == (name,)
    assert (p.io_mode, p.io_threads, p.queue_depth, p.io_backend) == DEVICE_CLASSES[want]
    assert p.fs_type == "ext4" and p.mount_point == "/" and not p.warnings


def test_a_device_mapper_volume_is_as_slow_as_its_slowest_disk(tmp_path, sysfs):
    block(sysfs, "nvme0n1", rotational=0)
    block(sysfs, "sda", rotational=1)
    block(sysfs, "dm-0", slaves=("nvme0n1", "sda"), devnum="253:0")
    p = probe_local(tmp_path, sysfs, "253:0", fs="xfs")
    assert p.device_class == "hdd" and set(p.block_devices) == {"nvme0n1", "sda"}


def test_nfs_with_a_small_wsize_warns_with_the_remount_command(tmp_path):
    mnt = str(tmp_path)
    info = mountinfo(tmp_path, [("/", "ext4", "8:1", "rw"), (mnt, "nfs4", "0:50", "rw,vers=4.2,rsize=65536,wsize=65536")])
    p = probe_storage(tmp_path / "kv" / "tier", mountinfo=info)  # not created yet: its parent is probed
    assert p.device_class == "network" and p.fs_type == "nfs4" and p.mount_point == mnt
    assert p.nfs_wsize == 65536 and (p.io_mode, p.io_threads) == ("buffered", 16)
    assert len(p.warnings) == 1 and f"wsize={NFS_MIN_WSIZE}" in p.warnings[0] and mnt in p.warnings[0]
    big = mountinfo(tmp_path, [(mnt, "nfs", "0:50", f"rw,wsize={NFS_MIN_WSIZE}")])
    assert not probe_storage(tmp_path, mountinfo=big).warnings


@pytest.mark.parametrize("fs,want", [("tmpfs", "memory"), ("fuse.sshfs", "network"), ("lustre", "network")])
def test_memory_and_network_file_systems(tmp_path, fs, want):
    p = probe_storage(tmp_path, mountinfo=mountinfo(tmp_path, [(str(tmp_path), fs, "0:40", "rw")]))
    assert p.device_class == want and p.io_mode == "buffered"


def test_unreadable_system_files_give_the_unknown_class(tmp_path):
    p = probe_storage(tmp_path, sys_root=str(tmp_path / "nowhere"), mountinfo=str(tmp_path / "missing"))
    assert p.device_class == "unknown"
    assert (p.io_mode, p.io_threads, p.queue_depth, p.io_backend) == DEVICE_CLASSES["unknown"]
    assert "unknown" in p.describe()


def test_a_mount_point_with_a_space_is_matched(tmp_path):
    spaced = tmp_path / "my disk"
    spaced.mkdir()
    p = probe_storage(spaced, mountinfo=mountinfo(tmp_path, [("/", "ext4", "8:1", "rw"), (str(spaced), "tmpfs", "0:41", "rw")]))
    assert p.mount_point == str(spaced) and p.device_class == "memory"


def test_the_config_keeps_what_it_sets_and_takes_the_class_for_the_rest(tmp_path):
    nvme = StorageProfile(str(tmp_path), "nvme", io_mode="auto", io_threads=32, queue_depth=8, io_backend="auto")
    assert DiskTierConfig(str(tmp_path), 1 << 20).tuned(nvme) == ("auto", 32, 8, "auto")
    explicit = DiskTierConfig(str(tmp_path), 1 << 20, io_mode="direct", io_threads=3, queue_depth=2,
                              io_backend="threads")
    assert explicit.tuned(nvme) == ("direct", 3, 2, "threads")


def test_the_manager_opens_its_tier_with_the_probed_settings(tmp_path, caplog):
    cfg = config([group([0], [64])], disk=DiskTierConfig(str(tmp_path / "tier"), 1 << 20, container_bytes=1 << 16))
    with caplog.at_level(logging.WARNING, logger="kvcodec_sdk.manager"):
        m = KVCacheManager(cfg)
    p = m.disk_profile()
    assert isinstance(p, StorageProfile) and p.device_class in DEVICE_CLASSES
    again = probe_storage(tmp_path / "tier")  # the tier exists now: probed itself, same storage
    assert (p.device_class, p.fs_type, p.io_threads) == (again.device_class, again.fs_type, again.io_threads)
    assert [r.getMessage() for r in caplog.records] == [f"disk tier {tmp_path / 'tier'}: {w}" for w in p.warnings]
    st = m.disk_stats(0)
    if p.io_backend == "threads":
        assert st["io_backend"] == "threads"
    else:  # "auto": io_uring, or the pool with the reason the kernel refused it
        assert st["io_backend"] == "io_uring" or st["io_backend_note"], st
    m.close()
    assert KVCacheManager(config([group([0], [64])])).disk_profile() is None
