// pulumi-kubernetes v4.32.0 provider/pkg/provider/helm_release.go line 907 (blob 45f58f59b1e364223f384c9b8dda5ab714faa7c1), in Diff:
		forceNewFields := []string{".name", ".namespace"}
// pulumi-kubernetes v4.32.0 provider/pkg/provider/provider.go lines 1559-1566 (blob 541d48ca93cbb2ad756ac28b24d1002c39bf6f11), in Diff:
		// Changing the identity of the resource always causes a replacement.
		forceNewFields := []string{".metadata.name", ".metadata.namespace"}
		if !kinds.IsPatchResource(
			urn,
			newInputs.GetKind(),
		) { // Patch resources can be updated in place for all other properties.
			forceNewFields = k.forceNewProperties(newInputs)
		}
