"""What every method of Milvus' gRPC service (``MilvusService``) does, for the gate.

``grpc`` claims the whole service, and a method the gate does not
know is CONTENT (``grpc_adapter.GrpcAdapter``): it may return stored data.
So ``KINDS`` lists every method of ``MilvusService`` in pymilvus 3.0.2's
proto, grouped by what they act on: FILTERED ``Search``, ``HybridSearch``
and ``Query`` (their replies are filtered); READ what returns no chunk
content (schemas, names, states, health, the caller's own text run through
an analyzer); CONTENT what returns data the gate cannot filter, counts
every tenant's rows or names what they came from (collection, partition,
namespace and index statistics, namespace names and their existence,
segment infos, import states with their row ids and files, external
collection refresh jobs with their source, distances between stored
vectors, metrics, snapshots, which copy or export whole collections, RBAC
backups, replication settings with other clusters' tokens, WAL dumps,
``Dummy``, which runs a query given as text); WRITE the rest. The REST
twin (``rest.V2_ROUTES``) classifies the same operations alike. The
service has 144 methods: the table is a module of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from sidecar.core.hits import RouteKind

_F, _R, _C, _W = RouteKind.FILTERED, RouteKind.READ, RouteKind.CONTENT, RouteKind.WRITE
KINDS: Final[Mapping[str, RouteKind]] = {
    # Collections.
    "CreateCollection": _W,
    "DropCollection": _W,
    "HasCollection": _R,
    "LoadCollection": _W,
    "ReleaseCollection": _W,
    "DescribeCollection": _R,
    "BatchDescribeCollection": _R,
    "GetCollectionStatistics": _C,  # row counts of every tenant
    "ShowCollections": _R,
    "AlterCollection": _W,
    "AlterCollectionField": _W,
    "AddCollectionFunction": _W,
    "AlterCollectionFunction": _W,
    "DropCollectionFunction": _W,
    "TruncateCollection": _W,
    "AddCollectionField": _W,
    "AddCollectionStructField": _W,
    "AlterCollectionSchema": _W,
    "RenameCollection": _W,
    "RefreshExternalCollection": _W,
    # Refresh jobs name the external source the rows come from, and its spec.
    "GetRefreshExternalCollectionProgress": _C,
    "ListRefreshExternalCollectionJobs": _C,
    "BatchUpdateManifest": _W,
    # Partitions.
    "CreatePartition": _W,
    "DropPartition": _W,
    "HasPartition": _R,
    "LoadPartitions": _W,
    "ReleasePartitions": _W,
    "GetPartitionStatistics": _C,  # row counts
    "ShowPartitions": _R,
    "Prewarm": _W,
    "DescribePrewarmTask": _R,
    # Namespaces: names (one per tenant, often) with entity counts.
    "CreateNamespace": _W,
    "DescribeNamespace": _C,
    "ListNamespaces": _C,
    "DropNamespace": _W,
    "HasNamespace": _C,  # a listing of namespaces, one name at a time
    "GetNamespaceStats": _C,
    # Loading.
    "GetLoadingProgress": _R,
    "GetLoadState": _R,
    # Aliases.
    "CreateAlias": _W,
    "DropAlias": _W,
    "AlterAlias": _W,
    "DescribeAlias": _R,
    "ListAliases": _R,
    # Indexes: descriptions and progress count indexed and total rows.
    "CreateIndex": _W,
    "AlterIndex": _W,
    "DescribeIndex": _C,
    "GetIndexStatistics": _C,
    "GetIndexState": _R,
    "GetIndexBuildProgress": _C,
    "DropIndex": _W,
    # Entities.
    "Insert": _W,
    "Delete": _W,
    "Upsert": _W,
    "Search": _F,
    "HybridSearch": _F,
    "Query": _F,
    "CalcDistance": _C,  # distances between stored vectors, by id
    # Flush, segments, compaction, import.
    "Flush": _W,
    "FlushAll": _W,
    "GetFlushState": _R,
    "GetFlushAllState": _R,
    "GetPersistentSegmentInfo": _C,  # rows per segment
    "GetQuerySegmentInfo": _C,  # rows per segment
    "GetReplicas": _R,
    "LoadBalance": _W,
    "GetCompactionState": _R,
    "ManualCompaction": _W,
    "GetCompactionStateWithPlans": _R,
    "Import": _W,
    "GetImportState": _C,  # row counts and the ids of imported rows
    "ListImportTasks": _C,
    "ListIndexedSegment": _R,
    "DescribeSegmentIndexData": _C,  # index data (vectors)
    # Cluster, health, connection.
    "Dummy": _C,  # runs a query given as text, past the gate
    "RegisterLink": _R,
    "GetMetrics": _C,  # system metrics, which count rows
    "GetComponentStates": _R,
    "GetVersion": _R,
    "CheckHealth": _R,
    "Connect": _R,
    "AllocTimestamp": _R,
    "RunAnalyzer": _R,  # the caller's own text, tokenised
    "ComputePhraseMatchSlop": _R,  # the caller's own texts
    # Users, roles, privileges, RBAC, row policies.
    "CreateCredential": _W,
    "UpdateCredential": _W,
    "DeleteCredential": _W,
    "ListCredUsers": _R,
    "CreateRole": _W,
    "AlterRole": _W,
    "DropRole": _W,
    "OperateUserRole": _W,
    "SelectRole": _R,
    "SelectUser": _R,
    "OperatePrivilege": _W,
    "OperatePrivilegeV2": _W,
    "SelectGrant": _R,
    "BackupRBAC": _C,  # users with their passwords
    "RestoreRBAC": _W,
    "CreatePrivilegeGroup": _W,
    "DropPrivilegeGroup": _W,
    "ListPrivilegeGroups": _R,
    "OperatePrivilegeGroup": _W,
    "AddUserTags": _W,
    "DeleteUserTags": _W,
    "GetUserTags": _R,
    "ListUsersWithTag": _R,
    "CreateRowPolicy": _W,
    "DropRowPolicy": _W,
    "ListRowPolicies": _R,
    # Resource groups.
    "CreateResourceGroup": _W,
    "DropResourceGroup": _W,
    "UpdateResourceGroups": _W,
    "TransferNode": _W,
    "TransferReplica": _W,
    "ListResourceGroups": _R,
    "DescribeResourceGroup": _R,
    # Databases.
    "CreateDatabase": _W,
    "DropDatabase": _W,
    "ListDatabases": _R,
    "AlterDatabase": _W,
    "DescribeDatabase": _R,
    # Files.
    "AddFileResource": _W,
    "RemoveFileResource": _W,
    "ListFileResources": _R,
    # Replication: messages and streams carry rows; the configuration holds
    # other clusters' tokens.
    "ReplicateMessage": _W,
    "UpdateReplicateConfiguration": _W,
    "GetReplicateConfiguration": _C,
    "GetReplicateInfo": _R,
    "CreateReplicateStream": _W,
    "DumpMessages": _C,  # the write-ahead log: every inserted row
    # Snapshots copy, restore or export whole collections, every tenant's rows.
    "CreateSnapshot": _C,
    "DropSnapshot": _C,
    "ListSnapshots": _C,
    "DescribeSnapshot": _C,
    "RestoreSnapshot": _C,
    "RestoreExternalSnapshot": _C,
    "ExportSnapshot": _C,
    "GetExportSnapshotState": _C,
    "GetRestoreSnapshotState": _C,
    "ListRestoreSnapshotJobs": _C,
    "PinSnapshotData": _C,
    "UnpinSnapshotData": _C,
}
