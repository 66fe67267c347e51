"""Route classes agree across the REST and gRPC APIs of one database.

A caller refused a route on one API must not be answered the same thing on
the other. For each database with both APIs (Milvus, Qdrant, Weaviate,
Pinecone), its REST routes and gRPC methods are listed below in groups of
equivalents: the members of a group expose the same thing (the same rows,
the same counts, the same change), so they have the same class, as the gate
classifies them with every built-in format enabled. A group with members on
one side only says, explicitly, that the other API has none.

The lists are complete where the gate's tables are: every gRPC method of the
services a format claims (in the gate's copy of the proto, or in the
format's table) and every route of Milvus' REST table belongs to exactly one
group, so a method or route added to a table fails here until someone
decides what it is equivalent to. REST routes of the other databases are the
ones their OpenAPI documents list (Qdrant 1.16, Weaviate 1.34, Pinecone's
2025-10 and 2026-07 data plane), with sample names for path parameters.

Two differences are allowed, and each is declared where it occurs:

- ``unread``: a member the gate cannot filter (its answers are in a shape
  no format reads) is content where the others are filtered: refused by
  default, never passed unread;
- a group of kind None is claimed by no format on either side (unknown
  routes: refused unless policy data allows unknown routes).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

import pytest

from sidecar.core.hits import Route, RouteKind
from sidecar.formats import grpc_messages
from sidecar.formats.grpc_adapter import GrpcAdapter
from sidecar.formats.milvus.grpc_methods import KINDS as MILVUS_KINDS
from sidecar.formats.milvus.rest import V1_ROUTES, V2_ROUTES
from sidecar.formats.pinecone.grpc import PineconeGrpcFormat
from sidecar.formats.qdrant.grpc import SERVICE_KINDS as QDRANT_KINDS
from sidecar.formats.registry import build_format_table
from sidecar.formats.weaviate.grpc import WeaviateGrpcFormat

F, R, C, W = RouteKind.FILTERED, RouteKind.READ, RouteKind.CONTENT, RouteKind.WRITE
TABLE = build_format_table({}, {}, text_field="text", id_field=None)


@dataclass(frozen=True)
class Same:
    """Routes (``"METHOD /path"``) and gRPC methods (``"Method"`` of the database's
    main service, or ``"package.Service/Method"``) that expose the same thing."""

    kind: RouteKind | None
    rest: tuple[str, ...] = ()
    grpc: tuple[str, ...] = ()
    unread: tuple[str, ...] = ()  # members that are content where the group is filtered


@dataclass(frozen=True)
class Database:
    service: str  # the main gRPC service: bare method names are its
    groups: tuple[Same, ...]
    methods: frozenset[str]  # every gRPC method of the claimed services, as full paths


def _grpc_path(service: str, member: str) -> str:
    return f"/{member}" if "/" in member else f"/{service}/{member}"


def _proto_methods(service: str) -> set[str]:
    """The methods of ``service`` in the gate's compiled copy of the database's proto."""
    pool = grpc_messages.message_class("qdrant.ScoredPoint").DESCRIPTOR.file.pool
    return {f"/{service}/{m.name}" for m in pool.FindServiceByName(service).methods}


def v2(*actions: str) -> tuple[str, ...]:
    return tuple(f"POST /v2/vectordb/{action}" for action in actions)


def v1(*routes: str) -> tuple[str, ...]:
    return tuple(f"{method} /v1/vector/{path}" for method, path in map(str.split, routes))


MILVUS_SERVICE: Final = "milvus.proto.milvus.MilvusService"
MILVUS = Database(
    MILVUS_SERVICE,
    (
        # Entities.
        Same(F, v2("entities/search") + v1("POST search"), ("Search",), v1("POST search")),
        Same(F, v2("entities/hybrid_search", "entities/advanced_search"), ("HybridSearch",)),
        Same(
            F,
            v2("entities/query", "entities/get") + v1("POST query", "POST get"),
            ("Query",),
            v1("POST query", "POST get"),
        ),
        Same(W, v2("entities/insert") + v1("POST insert"), ("Insert",)),
        Same(W, v2("entities/upsert") + v1("POST upsert"), ("Upsert",)),
        Same(W, v2("entities/delete") + v1("POST delete"), ("Delete",)),
        # Collections.
        Same(R, v2("collections/list") + v1("GET collections"), ("ShowCollections",)),
        Same(R, v2("collections/has"), ("HasCollection",)),
        Same(
            R,
            v2("collections/describe") + v1("GET collections/describe"),
            ("DescribeCollection", "BatchDescribeCollection"),
        ),
        Same(C, v2("collections/get_stats"), ("GetCollectionStatistics",)),
        Same(R, v2("collections/get_load_state"), ("GetLoadState",)),
        Same(W, v2("collections/create") + v1("POST collections/create"), ("CreateCollection",)),
        Same(W, v2("collections/drop") + v1("POST collections/drop"), ("DropCollection",)),
        Same(W, v2("collections/truncate"), ("TruncateCollection",)),
        Same(W, v2("collections/rename"), ("RenameCollection",)),
        Same(W, v2("collections/load", "collections/refresh_load"), ("LoadCollection",)),
        Same(W, v2("collections/release"), ("ReleaseCollection",)),
        Same(
            W,
            v2("collections/alter_properties", "collections/drop_properties"),
            ("AlterCollection",),
        ),
        Same(W, v2("collections/add_function"), ("AddCollectionFunction",)),
        Same(W, v2("collections/alter_function"), ("AlterCollectionFunction",)),
        Same(W, v2("collections/drop_function"), ("DropCollectionFunction",)),
        Same(
            W,
            v2("collections/add_function_field", "collections/drop_function_field")
            + v2("collections/fields/drop"),
            ("AlterCollectionSchema",),
        ),
        Same(W, v2("collections/fields/alter_properties"), ("AlterCollectionField",)),
        Same(W, v2("collections/fields/add"), ("AddCollectionField",)),
        Same(W, v2("collections/struct_fields/add"), ("AddCollectionStructField",)),
        Same(W, v2("collections/compact"), ("ManualCompaction",)),
        Same(R, v2("collections/get_compaction_state"), ("GetCompactionState",)),
        Same(W, v2("collections/flush"), ("Flush",)),
        # Databases.
        Same(R, v2("databases/list"), ("ListDatabases",)),
        Same(R, v2("databases/describe"), ("DescribeDatabase",)),
        Same(W, v2("databases/create"), ("CreateDatabase",)),
        Same(W, v2("databases/drop"), ("DropDatabase",)),
        Same(
            W,
            v2("databases/alter", "databases/alter_properties", "databases/drop_properties"),
            ("AlterDatabase",),
        ),
        # Partitions.
        Same(R, v2("partitions/list"), ("ShowPartitions",)),
        Same(R, v2("partitions/has"), ("HasPartition",)),
        Same(C, v2("partitions/get_stats"), ("GetPartitionStatistics",)),
        Same(W, v2("partitions/create"), ("CreatePartition",)),
        Same(W, v2("partitions/drop"), ("DropPartition",)),
        Same(W, v2("partitions/load"), ("LoadPartitions",)),
        Same(W, v2("partitions/release"), ("ReleasePartitions",)),
        # Users, roles, privilege groups.
        Same(R, v2("users/list"), ("ListCredUsers",)),
        Same(R, v2("users/describe"), ("SelectUser",)),
        Same(W, v2("users/create"), ("CreateCredential",)),
        Same(W, v2("users/update_password"), ("UpdateCredential",)),
        Same(W, v2("users/drop"), ("DeleteCredential",)),
        Same(W, v2("users/grant_role", "users/revoke_role"), ("OperateUserRole",)),
        Same(R, v2("roles/list"), ("SelectRole",)),
        Same(R, v2("roles/describe"), ("SelectGrant",)),
        Same(W, v2("roles/create"), ("CreateRole",)),
        Same(W, v2("roles/alter"), ("AlterRole",)),
        Same(W, v2("roles/drop"), ("DropRole",)),
        Same(W, v2("roles/grant_privilege", "roles/revoke_privilege"), ("OperatePrivilege",)),
        Same(
            W,
            v2("roles/grant_privilege_v2", "roles/revoke_privilege_v2"),
            ("OperatePrivilegeV2",),
        ),
        Same(R, v2("privilege_groups/list"), ("ListPrivilegeGroups",)),
        Same(W, v2("privilege_groups/create"), ("CreatePrivilegeGroup",)),
        Same(W, v2("privilege_groups/drop"), ("DropPrivilegeGroup",)),
        Same(
            W,
            v2("privilege_groups/add_privileges_to_group")
            + v2("privilege_groups/remove_privileges_from_group"),
            ("OperatePrivilegeGroup",),
        ),
        # Indexes: the description counts indexed and total rows; the REST
        # listing gives names only, which no gRPC method gives alone.
        Same(C, v2("indexes/describe"), ("DescribeIndex",)),
        Same(R, v2("indexes/list")),
        Same(W, v2("indexes/create"), ("CreateIndex",)),
        Same(W, v2("indexes/drop"), ("DropIndex",)),
        Same(W, v2("indexes/alter_properties", "indexes/drop_properties"), ("AlterIndex",)),
        # Aliases.
        Same(R, v2("aliases/list"), ("ListAliases",)),
        Same(R, v2("aliases/describe"), ("DescribeAlias",)),
        Same(W, v2("aliases/create"), ("CreateAlias",)),
        Same(W, v2("aliases/drop"), ("DropAlias",)),
        Same(W, v2("aliases/alter"), ("AlterAlias",)),
        # Imports: row counts, row ids and file names.
        Same(C, v2("jobs/import/list") + v1("GET bulkinsert/list"), ("ListImportTasks",)),
        Same(
            C,
            v2("jobs/import/describe", "jobs/import/get_progress") + v1("GET bulkinsert/describe"),
            ("GetImportState",),
        ),
        Same(W, v2("jobs/import/create") + v1("POST bulkinsert"), ("Import",)),
        Same(W, v2("jobs/import/commit", "jobs/import/abort")),
        # Snapshots copy whole collections; the REST snapshot routes other than
        # these jobs are not in the table (content, as any route it does not know).
        Same(C, v2("jobs/snapshot/restore_external"), ("RestoreExternalSnapshot",)),
        Same(C, v2("jobs/snapshot/export"), ("ExportSnapshot",)),
        Same(C, v2("jobs/snapshot/describe"), ("GetRestoreSnapshotState",)),
        Same(C, v2("jobs/snapshot/list"), ("ListRestoreSnapshotJobs",)),
        Same(
            C,
            grpc=(
                "CreateSnapshot",
                "DropSnapshot",
                "ListSnapshots",
                "DescribeSnapshot",
                "RestoreSnapshot",
                "GetExportSnapshotState",
                "PinSnapshotData",
                "UnpinSnapshotData",
            ),
        ),
        # External collections: their jobs name the source and its spec.
        Same(W, v2("jobs/external_collection/refresh"), ("RefreshExternalCollection",)),
        Same(
            C,
            v2("jobs/external_collection/describe"),
            ("GetRefreshExternalCollectionProgress",),
        ),
        Same(C, v2("jobs/external_collection/list"), ("ListRefreshExternalCollectionJobs",)),
        # Resource groups and file resources.
        Same(R, v2("resource_groups/list"), ("ListResourceGroups",)),
        Same(R, v2("resource_groups/describe"), ("DescribeResourceGroup",)),
        Same(W, v2("resource_groups/create"), ("CreateResourceGroup",)),
        Same(W, v2("resource_groups/drop"), ("DropResourceGroup",)),
        Same(W, v2("resource_groups/alter"), ("UpdateResourceGroups",)),
        Same(W, v2("resource_groups/transfer_replica"), ("TransferReplica",)),
        Same(R, v2("file_resources/list"), ("ListFileResources",)),
        Same(W, v2("file_resources/add"), ("AddFileResource",)),
        Same(W, v2("file_resources/remove"), ("RemoveFileResource",)),
        # Segments (rows per segment), quota and system metrics, the analyzer.
        Same(
            C,
            v2("segments/describe"),
            ("GetPersistentSegmentInfo", "GetQuerySegmentInfo"),
        ),
        Same(C, v2("quotacenter/describe")),
        Same(R, v2("common/run_analyzer"), ("RunAnalyzer",)),
        # gRPC only.
        Same(
            R,
            grpc=(
                "DescribePrewarmTask",
                "GetLoadingProgress",
                "GetIndexState",
                "GetFlushState",
                "GetFlushAllState",
                "GetReplicas",
                "GetCompactionStateWithPlans",
                "ListIndexedSegment",
                "RegisterLink",
                "GetComponentStates",
                "GetVersion",
                "CheckHealth",
                "Connect",
                "AllocTimestamp",
                "ComputePhraseMatchSlop",
                "GetUserTags",
                "ListUsersWithTag",
                "ListRowPolicies",
                "GetReplicateInfo",
            ),
        ),
        Same(
            C,
            grpc=(
                "DescribeNamespace",
                "ListNamespaces",
                "HasNamespace",
                "GetNamespaceStats",
                "GetIndexStatistics",
                "GetIndexBuildProgress",
                "CalcDistance",
                "DescribeSegmentIndexData",
                "Dummy",
                "GetMetrics",
                "BackupRBAC",
                "GetReplicateConfiguration",
                "DumpMessages",
            ),
        ),
        Same(
            W,
            grpc=(
                "BatchUpdateManifest",
                "Prewarm",
                "CreateNamespace",
                "DropNamespace",
                "FlushAll",
                "LoadBalance",
                "RestoreRBAC",
                "AddUserTags",
                "DeleteUserTags",
                "CreateRowPolicy",
                "DropRowPolicy",
                "TransferNode",
                "ReplicateMessage",
                "UpdateReplicateConfiguration",
                "CreateReplicateStream",
            ),
        ),
    ),
    frozenset(_proto_methods(MILVUS_SERVICE) | {f"/{MILVUS_SERVICE}/{m}" for m in MILVUS_KINDS}),
)

POINTS = "/collections/docs/points"
QDRANT = Database(
    "qdrant.Points",
    (
        Same(F, (f"POST {POINTS}", f"GET {POINTS}/1"), ("Get",)),
        Same(F, (f"POST {POINTS}/scroll",), ("Scroll",)),
        Same(F, (f"POST {POINTS}/search",), ("Search",)),
        Same(F, (f"POST {POINTS}/search/batch",), ("SearchBatch",)),
        Same(F, (f"POST {POINTS}/search/groups",), ("SearchGroups",)),
        Same(F, (f"POST {POINTS}/recommend",), ("Recommend",)),
        Same(F, (f"POST {POINTS}/recommend/batch",), ("RecommendBatch",)),
        Same(F, (f"POST {POINTS}/recommend/groups",), ("RecommendGroups",)),
        Same(F, (f"POST {POINTS}/discover",), ("Discover",)),
        Same(F, (f"POST {POINTS}/discover/batch",), ("DiscoverBatch",)),
        Same(F, (f"POST {POINTS}/query",), ("Query",)),
        Same(F, (f"POST {POINTS}/query/batch",), ("QueryBatch",)),
        Same(F, (f"POST {POINTS}/query/groups",), ("QueryGroups",)),
        Same(C, (f"POST {POINTS}/count",), ("Count",)),
        Same(C, ("POST /collections/docs/facet",), ("Facet",)),
        Same(C, (f"POST {POINTS}/search/matrix/pairs",), ("SearchMatrixPairs",)),
        Same(C, (f"POST {POINTS}/search/matrix/offsets",), ("SearchMatrixOffsets",)),
        Same(W, (f"PUT {POINTS}",), ("Upsert",)),
        Same(W, (f"POST {POINTS}/delete",), ("Delete",)),
        Same(W, (f"PUT {POINTS}/vectors",), ("UpdateVectors",)),
        Same(W, (f"POST {POINTS}/vectors/delete",), ("DeleteVectors",)),
        Same(W, (f"POST {POINTS}/payload",), ("SetPayload",)),
        Same(W, (f"PUT {POINTS}/payload",), ("OverwritePayload",)),
        Same(W, (f"POST {POINTS}/payload/delete",), ("DeletePayload",)),
        Same(W, (f"POST {POINTS}/payload/clear",), ("ClearPayload",)),
        Same(W, (f"POST {POINTS}/batch",), ("UpdateBatch",)),
        Same(W, ("PUT /collections/docs/index",), ("CreateFieldIndex",)),
        Same(W, ("DELETE /collections/docs/index/title",), ("DeleteFieldIndex",)),
        Same(W, ("PUT /collections/docs/vectors/extra",), ("CreateVectorName",)),
        Same(W, ("DELETE /collections/docs/vectors/extra",), ("DeleteVectorName",)),
        # Collection info counts points: the REST answer is filtered (counts
        # removed), the gRPC reply is not read.
        Same(
            F,
            ("GET /collections/docs",),
            ("qdrant.Collections/Get",),
            ("qdrant.Collections/Get",),
        ),
        # Names of every collection and shard key; points per shard.
        Same(C, ("GET /collections",), ("qdrant.Collections/List",)),
        Same(C, ("GET /collections/docs/aliases",), ("qdrant.Collections/ListCollectionAliases",)),
        Same(C, ("GET /aliases",), ("qdrant.Collections/ListAliases",)),
        Same(C, ("GET /collections/docs/cluster",), ("qdrant.Collections/CollectionClusterInfo",)),
        Same(C, ("GET /collections/docs/shards",), ("qdrant.Collections/ListShardKeys",)),
        Same(R, ("GET /collections/docs/exists",), ("qdrant.Collections/CollectionExists",)),
        Same(W, ("PUT /collections/docs",), ("qdrant.Collections/Create",)),
        Same(W, ("PATCH /collections/docs",), ("qdrant.Collections/Update",)),
        Same(W, ("DELETE /collections/docs",), ("qdrant.Collections/Delete",)),
        Same(W, ("POST /collections/aliases",), ("qdrant.Collections/UpdateAliases",)),
        Same(
            W,
            ("POST /collections/docs/cluster",),
            ("qdrant.Collections/UpdateCollectionClusterSetup",),
        ),
        Same(W, ("PUT /collections/docs/shards",), ("qdrant.Collections/CreateShardKey",)),
        Same(W, ("POST /collections/docs/shards/delete",), ("qdrant.Collections/DeleteShardKey",)),
        # Snapshots copy a collection, or the whole storage.
        Same(C, ("POST /collections/docs/snapshots",), ("qdrant.Snapshots/Create",)),
        Same(C, ("GET /collections/docs/snapshots",), ("qdrant.Snapshots/List",)),
        Same(C, ("DELETE /collections/docs/snapshots/s1",), ("qdrant.Snapshots/Delete",)),
        Same(C, ("POST /snapshots",), ("qdrant.Snapshots/CreateFull",)),
        Same(C, ("GET /snapshots",), ("qdrant.Snapshots/ListFull",)),
        Same(C, ("DELETE /snapshots/s1",), ("qdrant.Snapshots/DeleteFull",)),
        # REST only: snapshot downloads, uploads and recovery, shard snapshots,
        # optimisations in progress; telemetry and metrics count every point.
        Same(
            C,
            (
                "GET /collections/docs/snapshots/s1",
                "PUT /collections/docs/snapshots/recover",
                "POST /collections/docs/snapshots/upload",
                "GET /snapshots/s1",
                "POST /collections/docs/shards/0/snapshots",
                "GET /collections/docs/shards/0/snapshots",
                "GET /collections/docs/shards/0/snapshots/s1",
                "DELETE /collections/docs/shards/0/snapshots/s1",
                "PUT /collections/docs/shards/0/snapshots/recover",
                "POST /collections/docs/shards/0/snapshots/upload",
                "GET /collections/docs/shards/0/snapshot",
                "GET /collections/docs/optimizations",
                "GET /telemetry",
                "GET /metrics",
                "GET /cluster/telemetry",
            ),
        ),
        # Claimed by no format on either side: health, the cluster, quotas, issues.
        Same(
            None,
            (
                "GET /healthz",
                "GET /livez",
                "GET /readyz",
                "GET /cluster",
                "POST /cluster/recover",
                "DELETE /cluster/peer/1",
                "GET /issues",
                "DELETE /issues",
                "GET /quotas",
                "PUT /quotas",
            ),
            ("qdrant.Qdrant/HealthCheck",),
        ),
    ),
    frozenset(
        path
        for service, kinds in QDRANT_KINDS.items()
        for path in (_proto_methods(service) | {f"/{service}/{m}" for m in kinds})
    ),
)

PINECONE_SERVICE: Final = "VectorService"
DOCUMENTS = "/namespaces/ns/documents"
PINECONE = Database(
    PINECONE_SERVICE,
    (
        Same(F, ("POST /query",), ("Query",)),
        # Vectors by id: the gRPC reply is filtered, the REST answer is not read.
        Same(F, ("GET /vectors/fetch",), ("Fetch",), ("GET /vectors/fetch",)),
        Same(C, ("POST /vectors/fetch_by_metadata",), ("FetchByMetadata",)),
        Same(C, ("GET /vectors/list",), ("List",)),
        Same(
            C, ("POST /describe_index_stats", "GET /describe_index_stats"), ("DescribeIndexStats",)
        ),
        Same(C, ("GET /namespaces",), ("ListNamespaces",)),
        Same(C, ("GET /namespaces/ns",), ("DescribeNamespace",)),
        Same(W, ("POST /namespaces",), ("CreateNamespace",)),
        Same(W, ("DELETE /namespaces/ns",), ("DeleteNamespace",)),
        Same(W, ("POST /vectors/upsert",), ("Upsert",)),
        Same(W, ("POST /vectors/update",), ("Update",)),
        Same(W, ("POST /vectors/delete",), ("Delete",)),
        # REST only: records search and upsert, bulk imports, namespace aliases,
        # the documents API.
        Same(F, ("POST /records/namespaces/ns/search",)),
        Same(
            C,
            (
                "GET /bulk/imports",  # source URIs, recordsImported
                "GET /bulk/imports/101",
                "GET /namespace-aliases",  # each names its namespace
                "GET /namespace-aliases/current",
                f"POST {DOCUMENTS}/search",
                f"POST {DOCUMENTS}/fetch",
                f"POST {DOCUMENTS}/list",
            ),
        ),
        Same(
            W,
            (
                "POST /records/namespaces/ns/upsert",
                "POST /bulk/imports",
                "DELETE /bulk/imports/101",
                "POST /namespace-aliases",
                "PATCH /namespace-aliases/current",
                "DELETE /namespace-aliases/current",
                f"POST {DOCUMENTS}/upsert",
                f"POST {DOCUMENTS}/update",
                f"POST {DOCUMENTS}/delete",
            ),
        ),
    ),
    frozenset(
        _proto_methods(PINECONE_SERVICE)
        | {f"/{PINECONE_SERVICE}/{m}" for m in PineconeGrpcFormat.kinds}
    ),
)

WEAVIATE_SERVICE: Final = "weaviate.v1.Weaviate"
UUID: Final = "00000000-0000-4000-8000-000000000001"
SEARCH_API = "/v1/search/Chunk"
WEAVIATE = Database(
    WEAVIATE_SERVICE,
    (
        # Objects, searched or fetched: GraphQL is filtered, the gRPC reply
        # too; the REST object and search APIs are not read.
        Same(
            F,
            (
                "POST /v1/graphql",
                "POST /v1/graphql/batch",
                f"POST {SEARCH_API}/bm25",
                f"POST {SEARCH_API}/hybrid",
                f"POST {SEARCH_API}/near-object",
                f"POST {SEARCH_API}/near-text",
                "GET /v1/objects",
                f"GET /v1/objects/{UUID}",
                f"GET /v1/objects/Chunk/{UUID}",
                f"HEAD /v1/objects/Chunk/{UUID}",
            ),
            ("Search",),
            (
                f"POST {SEARCH_API}/bm25",
                f"POST {SEARCH_API}/hybrid",
                f"POST {SEARCH_API}/near-object",
                f"POST {SEARCH_API}/near-text",
                "GET /v1/objects",
                f"GET /v1/objects/{UUID}",
                f"GET /v1/objects/Chunk/{UUID}",
                f"HEAD /v1/objects/Chunk/{UUID}",
            ),
        ),
        Same(C, ("POST /v1/aggregate/Chunk",), ("Aggregate",)),
        Same(
            C,
            (
                "GET /v1/schema/Chunk/tenants",
                "GET /v1/schema/Chunk/tenants/acme",
                "HEAD /v1/schema/Chunk/tenants/acme",
            ),
            ("TenantsGet",),
        ),
        Same(W, ("POST /v1/batch/objects",), ("BatchObjects", "BatchSend", "BatchStream")),
        Same(W, ("DELETE /v1/batch/objects",), ("BatchDelete",)),
        Same(W, ("POST /v1/batch/references",), ("BatchReferences",)),
        Same(
            R,
            ("GET /v1/.well-known/live", "GET /v1/.well-known/ready"),
            ("grpc.health.v1.Health/Check", "grpc.health.v1.Health/Watch"),
        ),
        # REST only.
        Same(
            R,
            (
                "GET /v1",
                "GET /v1/meta",
                "GET /v1/.well-known/openid-configuration",
                "POST /v1/tokenize",
                "POST /v1/schema/Chunk/properties/title/tokenize",
                "GET /v1/schema",
                "GET /v1/schema/Chunk",
                "GET /v1/schema/Chunk/indexes",
                "GET /v1/aliases",
                "GET /v1/aliases/current",
                "GET /v1/namespaces",
                "GET /v1/namespaces/n1",
                "GET /v1/cluster/statistics",
                "GET /v1/tasks",
                "GET /v1/users/own-info",
                "GET /v1/users/db",
                "GET /v1/users/db/u1",
                "GET /v1/authz/roles",
                "GET /v1/authz/roles/r1",
                "POST /v1/authz/roles/r1/has-permission",
                "GET /v1/authz/roles/r1/users",
                "GET /v1/authz/roles/r1/user-assignments",
                "GET /v1/authz/roles/r1/group-assignments",
                "GET /v1/authz/users/u1/roles",
                "GET /v1/authz/users/u1/roles/db",
                "GET /v1/authz/groups/g1/roles/oidc",
                "GET /v1/authz/groups/oidc",
                "GET /v1/replication/replicate/r1",
                "GET /v1/replication/replicate/list",
                "GET /v1/replication/sharding-state",
                "GET /v1/replication/scale",
            ),
        ),
        Same(
            C,
            (
                "GET /v1/nodes",  # objects per node and shard
                "GET /v1/nodes/Chunk",
                "GET /v1/schema/Chunk/shards",  # objects queued for indexing
                "GET /v1/classifications/c1",  # objects classified
                "POST /v1/backups/filesystem",
                "GET /v1/backups/filesystem",
                "GET /v1/backups/filesystem/b1",
                "DELETE /v1/backups/filesystem/b1",
                "POST /v1/backups/filesystem/b1/restore",
                "GET /v1/backups/filesystem/b1/restore",
                "DELETE /v1/backups/filesystem/b1/restore",
                "POST /v1/export/filesystem",
                "GET /v1/export/filesystem/e1",
                "DELETE /v1/export/filesystem/e1",
                "POST /v1/mcp",
                "GET /v1/mcp",
                "DELETE /v1/mcp",
                "GET /v1/modules/text2vec-contextionary/concepts/word",
            ),
        ),
        Same(
            W,
            (
                "POST /v1/objects",
                "POST /v1/objects/validate",
                f"PUT /v1/objects/{UUID}",
                f"PATCH /v1/objects/{UUID}",
                f"DELETE /v1/objects/{UUID}",
                f"PUT /v1/objects/Chunk/{UUID}",
                f"PATCH /v1/objects/Chunk/{UUID}",
                f"DELETE /v1/objects/Chunk/{UUID}",
                f"POST /v1/objects/{UUID}/references/cites",
                f"PUT /v1/objects/{UUID}/references/cites",
                f"DELETE /v1/objects/{UUID}/references/cites",
                f"POST /v1/objects/Chunk/{UUID}/references/cites",
                f"PUT /v1/objects/Chunk/{UUID}/references/cites",
                f"DELETE /v1/objects/Chunk/{UUID}/references/cites",
                "POST /v1/schema",
                "PUT /v1/schema/Chunk",
                "DELETE /v1/schema/Chunk",
                "POST /v1/schema/Chunk/properties",
                "PUT /v1/schema/Chunk/properties/title/index/filterable",
                "DELETE /v1/schema/Chunk/properties/title/index/filterable",
                "POST /v1/schema/Chunk/properties/title/index/filterable/rebuild",
                "POST /v1/schema/Chunk/properties/title/index/filterable/cancel",
                "DELETE /v1/schema/Chunk/vectors/default/index",
                "PUT /v1/schema/Chunk/shards/s1",
                "POST /v1/schema/Chunk/tenants",
                "PUT /v1/schema/Chunk/tenants",
                "DELETE /v1/schema/Chunk/tenants",
                "POST /v1/aliases",
                "PUT /v1/aliases/current",
                "DELETE /v1/aliases/current",
                "POST /v1/namespaces/n1",
                "PUT /v1/namespaces/n1",
                "DELETE /v1/namespaces/n1",
                "POST /v1/namespaces/n1/suspend",
                "POST /v1/namespaces/n1/resume",
                "POST /v1/users/db/u1",
                "DELETE /v1/users/db/u1",
                "POST /v1/users/db/u1/rotate-key",
                "POST /v1/users/db/u1/activate",
                "POST /v1/users/db/u1/deactivate",
                "POST /v1/authz/roles",
                "DELETE /v1/authz/roles/r1",
                "POST /v1/authz/roles/r1/add-permissions",
                "POST /v1/authz/roles/r1/remove-permissions",
                "POST /v1/authz/users/u1/assign",
                "POST /v1/authz/users/u1/revoke",
                "POST /v1/authz/groups/g1/assign",
                "POST /v1/authz/groups/g1/revoke",
                "POST /v1/replication/replicate",
                "DELETE /v1/replication/replicate",
                "POST /v1/replication/replicate/force-delete",
                "DELETE /v1/replication/replicate/r1",
                "POST /v1/replication/replicate/r1/cancel",
                "POST /v1/replication/scale",
                "POST /v1/classifications",
            ),
        ),
    ),
    frozenset(
        _proto_methods(WEAVIATE_SERVICE)
        | {f"/{WEAVIATE_SERVICE}/{m}" for m in WeaviateGrpcFormat.kinds}
    ),
)

DATABASES: Final[Mapping[str, Database]] = {
    "milvus": MILVUS,
    "qdrant": QDRANT,
    "pinecone": PINECONE,
    "weaviate": WEAVIATE,
}


def _members(database: Database) -> Iterator[tuple[Same, Route]]:
    """Every member of every group, as the route the gate classifies."""
    for group in database.groups:
        for member in group.rest:
            method, path = member.split(" ", 1)
            yield group, Route(method, path)
        for member in group.grpc:
            yield group, Route("POST", _grpc_path(database.service, member))


def _is_unread(database: Database, group: Same, route: Route) -> bool:
    rest = f"{route.method} {route.path}"
    return rest in group.unread or any(
        _grpc_path(database.service, m) == route.path for m in group.unread
    )


@pytest.mark.parametrize("name", DATABASES)
def test_equivalent_routes_have_the_same_class(name: str) -> None:
    database = DATABASES[name]
    disagree = []
    for group, route in _members(database):
        expected = group.kind
        if _is_unread(database, group, route):
            assert group.kind is F, "only a member of a filtered group can be unread"
            expected = C
        found = TABLE.route_kind(route)
        if found is not expected:
            disagree.append((route.method, route.path, found, expected))
    assert disagree == []


@pytest.mark.parametrize("name", DATABASES)
def test_every_grpc_method_belongs_to_exactly_one_group(name: str) -> None:
    database = DATABASES[name]
    listed = [route.path for group, route in _members(database) if route.path.count("/") == 2]
    grpc_listed = [path for path in listed if path in database.methods]
    assert sorted(set(database.methods) - set(grpc_listed)) == []  # every method has a group
    assert len(grpc_listed) == len(set(grpc_listed))  # in one group only


@pytest.mark.parametrize("name", DATABASES)
def test_no_route_is_listed_twice(name: str) -> None:
    members = [(route.method, route.path) for _, route in _members(DATABASES[name])]
    assert len(members) == len(set(members))


def test_every_route_of_milvus_rest_tables_belongs_to_a_group() -> None:
    listed = {route.path for _, route in _members(MILVUS) if route.path.startswith("/v")}
    filtered = {f"entities/{a}" for a in ("search", "hybrid_search", "advanced_search")}
    filtered |= {"entities/query", "entities/get"}
    tables = {f"/v2/vectordb/{route}" for route in [*V2_ROUTES, *filtered]}
    tables |= {f"/v1/vector/{route}" for route in V1_ROUTES}
    assert tables == listed


def test_every_grpc_format_is_checked_here() -> None:
    # A gRPC adapter added later needs its REST twin's groups above.
    grpc_services = {fmt.service for fmt in TABLE.formats if isinstance(fmt, GrpcAdapter)}
    assert grpc_services == {database.service for database in DATABASES.values()}
