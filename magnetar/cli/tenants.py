"""``magnetar tenants`` and ``magnetar namespaces``: tenants and their admin roles, namespaces and
their permissions (pulsar-admin's names and flags)."""

from __future__ import annotations

import argparse

from magnetar.cli.client import (
    CLIENT_COMMANDS,
    add_action,
    admin_client,
    emit,
)
from magnetar.cli.support import table


def _roles(text: str) -> list[str]:
    """``"r1,r2"`` as ``["r1", "r2"]`` (spaces and empty items dropped)."""
    return [role.strip() for role in text.split(",") if role.strip()]


_ACTIONS = ("produce", "consume")


def _actions(text: str) -> list[str]:
    """``"produce,consume"`` as ``["produce", "consume"]``; an unknown action is a usage error."""
    actions = [a.strip().lower() for a in text.split(",") if a.strip()]
    unknown = [a for a in actions if a not in _ACTIONS]
    if unknown or not actions:
        raise argparse.ArgumentTypeError(
            f"the actions are {' and '.join(_ACTIONS)}, comma-separated (e.g."
            f" produce,consume), got {text!r}"
        )
    return list(dict.fromkeys(actions))


def add_tenants_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tenants = commands.add_parser(
        "tenants",
        help=CLIENT_COMMANDS["tenants"],
        description="Tenants and the roles that administer them (their namespaces, permissions"
        " and topics). Creating, updating and deleting tenants needs a superuser.",
    )
    what = tenants.add_subparsers(dest="tenants_command", metavar="ACTION", required=True)
    roles_help = "comma-separated roles that administer the tenant (e.g. -r ops,team-a)"
    create = add_action(what, "create", "create a tenant", _tenant_create)
    create.add_argument("tenant", metavar="TENANT")
    create.add_argument(
        "-r", "--admin-roles", type=_roles, default=[], metavar="ROLES", help=roles_help
    )
    update = add_action(what, "update", "replace a tenant's admin roles", _tenant_update)
    update.add_argument("tenant", metavar="TENANT")
    update.add_argument(
        "-r",
        "--admin-roles",
        type=_roles,
        required=True,
        metavar="ROLES",
        help=roles_help + "; replaces the current ones ('' for none)",
    )
    add_action(
        what, "list", "the tenants this role may see (all of them for a superuser)", _tenant_list
    )
    get = add_action(what, "get", "a tenant's admin roles", _tenant_get)
    get.add_argument("tenant", metavar="TENANT")
    delete = add_action(
        what, "delete", "delete a tenant (refused while it has namespaces)", _tenant_delete
    )
    delete.add_argument("tenant", metavar="TENANT")


def add_namespaces_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    namespaces = commands.add_parser(
        "namespaces",
        help=CLIENT_COMMANDS["namespaces"],
        description="Namespaces (TENANT/NAMESPACE) and the permissions they grant roles on their"
        " topics. Needs an admin of the tenant or a superuser.",
    )
    what = namespaces.add_subparsers(dest="namespaces_command", metavar="ACTION", required=True)
    create = add_action(what, "create", "create a namespace", _namespace_create)
    create.add_argument("namespace", metavar="TENANT/NAMESPACE")
    listing = add_action(what, "list", "a tenant's namespaces", _namespace_list)
    listing.add_argument("tenant", metavar="TENANT")
    delete = add_action(
        what, "delete", "delete a namespace (refused while it has topics)", _namespace_delete
    )
    delete.add_argument("namespace", metavar="TENANT/NAMESPACE")
    grant = add_action(
        what,
        "grant-permission",
        "let a role produce and/or consume on every topic of a namespace",
        _grant_permission,
    )
    grant.add_argument("namespace", metavar="TENANT/NAMESPACE")
    grant.add_argument("--role", required=True, help="the role (a token's subject)")
    grant.add_argument(
        "--actions",
        type=_actions,
        required=True,
        metavar="ACTIONS",
        help="produce, consume or produce,consume; replaces what the role had here",
    )
    revoke = add_action(
        what, "revoke-permission", "take every permission on a namespace from a role", _revoke
    )
    revoke.add_argument("namespace", metavar="TENANT/NAMESPACE")
    revoke.add_argument("--role", required=True, help="the role")
    permissions = add_action(what, "permissions", "the roles granted on a namespace", _permissions)
    permissions.add_argument("namespace", metavar="TENANT/NAMESPACE")


def _role_list(roles: list[str]) -> str:
    return ", ".join(roles) or "(none)"


def _tenant_create(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        admin.create_tenant(args.tenant, args.admin_roles)
    return emit(
        args,
        {"tenant": args.tenant, "admin_roles": args.admin_roles},
        f"created tenant {args.tenant} (admin roles: {_role_list(args.admin_roles)})",
    )


def _tenant_update(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        admin.update_tenant(args.tenant, args.admin_roles)
    return emit(
        args,
        {"tenant": args.tenant, "admin_roles": args.admin_roles},
        f"updated tenant {args.tenant} (admin roles: {_role_list(args.admin_roles)})",
    )


def _tenant_list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        tenants = sorted(admin.list_tenants())
    return emit(args, tenants, table([{"tenant": t} for t in tenants], ["tenant"]))


def _tenant_get(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        info = admin.get_tenant(args.tenant)
    human = f"tenant       {info['tenant']}\nadmin roles  {_role_list(info['admin_roles'])}"
    return emit(args, info, human)


def _tenant_delete(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        admin.delete_tenant(args.tenant)
    return emit(args, {"tenant": args.tenant, "deleted": True}, f"deleted tenant {args.tenant}")


def _namespace_create(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        admin.create_namespace(args.namespace)
    return emit(args, {"namespace": args.namespace}, f"created namespace {args.namespace}")


def _namespace_list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        namespaces = sorted(admin.list_namespaces(args.tenant))
    return emit(args, namespaces, table([{"namespace": n} for n in namespaces], ["namespace"]))


def _namespace_delete(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        admin.delete_namespace(args.namespace)
    return emit(
        args,
        {"namespace": args.namespace, "deleted": True},
        f"deleted namespace {args.namespace}",
    )


def _grant_permission(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        admin.grant_permission(args.namespace, args.role, args.actions)
    return emit(
        args,
        {"namespace": args.namespace, "role": args.role, "actions": args.actions},
        f"granted {', '.join(args.actions)} on {args.namespace} to role {args.role}",
    )


def _revoke(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        admin.revoke_permission(args.namespace, args.role)
    return emit(
        args,
        {"namespace": args.namespace, "role": args.role, "revoked": True},
        f"revoked the permissions of role {args.role} on {args.namespace}",
    )


def _permissions(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        granted = admin.permissions(args.namespace)
    rows: list[dict[str, object]] = [
        {"role": role, "actions": ",".join(actions)} for role, actions in sorted(granted.items())
    ]
    return emit(args, granted, table(rows, ["role", "actions"]))
