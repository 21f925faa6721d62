"""What the tests and the benchmarks both stand on, and neither owns: servers on loopback (moto's
S3 API server, a fault-injecting proxy in front of it, a private PostgreSQL cluster) and the
workloads they drain. It imports nothing of `oml_dagster_tests`, so a benchmark never imports
the test suite. Not part of the installed package: it runs from a checkout."""
