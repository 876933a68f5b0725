// The console's entry: which page the address asks for. ?run=NAME a run's page, ?group=NAME a
// group's, otherwise the project's runs and groups (?project=P, default "default").
"use strict";

import { params, project } from "./console_api.js";
import { groupPage } from "./console_group.js";
import { projectPage, refreshBudget } from "./console_project.js";
import { runPage } from "./console_run.js";

document.getElementById("project").textContent = project;
document.getElementById("home").href = `?project=${encodeURIComponent(project)}`;
if (params.get("run")) {
  runPage(params.get("run"));
  refreshBudget().catch(console.error);
} else if (params.get("group")) {
  groupPage(params.get("group"));
  refreshBudget().catch(console.error);
} else {
  projectPage();
}
