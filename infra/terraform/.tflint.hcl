# tflint for the module, linted through each example (tests/infra/test_tflint.py runs
# `tflint --chdir examples/<name> --config <this file>`). Nothing is downloaded: the terraform
# ruleset is bundled with tflint, and the azurerm ruleset, when installed, is a binary in
# TFLINT_PLUGIN_DIR that the test enables with --enable-plugin=azurerm.
config {
  call_module_type = "local"
}

plugin "terraform" {
  enabled = true
  preset  = "all"
}
