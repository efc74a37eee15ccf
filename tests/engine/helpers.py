"""Group set-up shared by the engine tests."""

from __future__ import annotations

from svc_sdk.mls import Engine, Group


def make_group(creator: Engine, *others: Engine, group_id: bytes = b"org/ns/svc") -> list[Group]:
    """Creator makes a group and adds each of ``others``, as the delivery service would
    order it: commit accepted, then processed by existing members, then Welcome used."""
    group = creator.create_group(group_id)
    handles = [group]
    for other in others:
        pending = group.add_members([other.generate_key_package()])
        group.apply_pending_commit()
        for member in handles[1:]:
            assert member.process(pending.commit).kind == "commit"
        assert pending.welcome is not None
        handles.append(other.join_group(pending.welcome))
    return handles
