"""Private working directories, and what a killed run leaves of them.

ckptgate makes two kinds of directory while it works: the embedded OPA's **work directory** (the
staged, signed policy bundle, its public verification key and ``opa.log``) and the **staging
directory** beside DST that :mod:`ckptgate.publish` renames into place.  A ``kill -9`` cannot be
handled in the process it kills, so each directory is cleaned up by whichever ckptgate runs next:

* **Proof of death, not a guess.**  The owner holds a ``flock`` on the directory for its whole
  lifetime (on the file ``.lock`` inside a work directory; on the directory itself for a staging
  directory, whose every file is published), through a descriptor opened ``O_CLOEXEC`` that OPA
  and the contained worker never inherit.  The lock is shared, so that a process forked from the
  owner can hold a share of its own (:meth:`Lease.share_after_fork`: the private copies of
  :mod:`ckptgate.precedence`, which the last holder removes).  The kernel drops the lock when the
  owner dies, however it dies.  A sweep takes the lock without waiting: when it gets it, the owner is
  provably gone and the directory goes; when it does not, the directory is left alone.  PIDs,
  which are reused, are never consulted.
* **No half-made directory is swept.**  A directory is created and locked while its creator
  holds a shared ``flock`` on the parent; a sweep of the parent runs only under an exclusive one,
  taken without waiting (if it is busy, the sweep is left to a later run).
* **A registry finds them anywhere.**  Before a directory is made, its path is recorded in an
  entry under ``$XDG_STATE_HOME/ckptgate/live/`` (default ``~/.local/state/ckptgate/live/``),
  which the owner also holds locked for its lifetime.  Any later run, into any destination,
  sweeps the directories of entries whose owner is dead, then the entries.
* **Where work directories live.**  In ``$XDG_RUNTIME_DIR/ckptgate/`` when ``$XDG_RUNTIME_DIR``
  is set and usable (a directory owned by this user, mode 0700, not a symlink); otherwise in a
  private per-user directory ``$TMPDIR/ckptgate-<uid>/`` (``/tmp/ckptgate-<uid>/``), created 0700.
  One owned by someone else, a symlink, or open to others is refused
  (``engine.workdir.unsafe``); it is never used and never removed.
* **Only this user's.**  A sweep removes only directories owned by the user running it, with the
  names ckptgate gives them.

Work directories of ckptgate versions before this one (``$TMPDIR/ckptgate-opa-*``) carry no
lock, so nothing proves their owner dead: they are never swept automatically.  ``ckptgate
doctor`` lists them, and ``doctor --clean`` removes one only when it is *quiet*: no process
this user can see has a file in it open (or as its working directory), and nothing in it
changed for :data:`LEGACY_QUIET_S` seconds.  (An old embedded OPA keeps ``opa.log`` open for its
whole life; an old ckptgate staging a bundle changes the directory.)

The work is split by job: :mod:`~ckptgate.workdirs.places` (where directories live, their names),
:mod:`~ckptgate.workdirs.lease` (creating and holding one), :mod:`~ckptgate.workdirs.sweeping`
(removing what dead owners left) and :mod:`~ckptgate.workdirs.doctor` (``ckptgate doctor``'s list and
clean-up); every name is re-exported here.
"""

from __future__ import annotations

from ckptgate.workdirs.doctor import LEGACY_QUIET_S, Leftover, clean, find_leftovers
from ckptgate.workdirs.lease import Lease, create, create_work_dir, registered
from ckptgate.workdirs.places import LEGACY, LOCK_NAME, STAGING, WORK, registry_dir, runtime_dir
from ckptgate.workdirs.sweeping import held, lock_held, sweep, sweep_parent, sweep_registry

__all__ = [
    "LEGACY",
    "LEGACY_QUIET_S",
    "LOCK_NAME",
    "STAGING",
    "WORK",
    "Lease",
    "Leftover",
    "clean",
    "create",
    "create_work_dir",
    "find_leftovers",
    "held",
    "lock_held",
    "registered",
    "registry_dir",
    "runtime_dir",
    "sweep",
    "sweep_parent",
    "sweep_registry",
]
