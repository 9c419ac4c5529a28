from tests.single_thread import one_thread  # noqa: F401  (autouse)
