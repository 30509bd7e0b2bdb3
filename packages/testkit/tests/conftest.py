"""qnnx-testkit's own tests run pytest inside pytest (``pytester``) to check the plugin."""

pytest_plugins = ["pytester"]
