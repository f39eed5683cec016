"""The sidecar injector: a mutating admission webhook that adds meshplane's sidecar to pods."""
