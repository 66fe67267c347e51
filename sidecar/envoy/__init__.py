"""The Envoy servicers (ext_proc, ext_authz): protocol translation only, no policy."""
