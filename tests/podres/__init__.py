"""GPU pod attribution: the kubelet pod-resources client, the matcher, and a running agent against a test kubelet."""
