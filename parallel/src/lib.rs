//! weft-parallel: device meshes, communicators, the sharding planner and sharded training (issue #4; not built yet).
