"""The kernel's own default plugins, registered through the ``llmp`` entry points
of the ``llmp`` distribution exactly like third-party plugins."""
