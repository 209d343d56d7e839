"""A deployment on one machine: the supervisor and its process group, `pagedserve up`, worker names in
containers, the ops endpoints' HTTP, and the docker compose end-to-end driver (ops/compose_e2e.sh) with
the host's apt mirror it debootstraps from."""
