//! The coordinator: assigns attribute-test and match tasks to workers. Not built yet: the cluster issue fills it.
