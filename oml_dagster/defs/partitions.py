"""One dynamic partition per tenant, named uniquely for this code location."""

from dagster import DynamicPartitionsDefinition

TENANT_PARTITIONS_NAME = "oml_lake_tenants"

tenant_partitions = DynamicPartitionsDefinition(name=TENANT_PARTITIONS_NAME)
