"""Request and response models of the management API, one module (a schema family) per resource."""
