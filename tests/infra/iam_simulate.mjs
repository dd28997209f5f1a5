// Decides IAM requests with @cloud-copilot/iam-simulate (AWS's evaluation logic: policy variables, conditions,
// explicit denies, trust policies), offline. Reads {"cases": [{"policies": [...], "action", "resource", "principal",
// "account", "context", "resourcePolicy"}]} on stdin and writes one decision per case ("Allowed",
// "ImplicitlyDenied", "ExplicitlyDenied") or its errors. tests/infra/iam_simulate.py runs it.
import { runSimulation } from '@cloud-copilot/iam-simulate'

const input = JSON.parse(await new Promise((resolve) => {
  let text = ''
  process.stdin.on('data', (chunk) => { text += chunk })
  process.stdin.on('end', () => resolve(text))
}))
const out = []
for (const c of input.cases) {
  let result
  try {
    result = await runSimulation({
    request: {
      principal: c.principal, action: c.action,
      resource: { resource: c.resource, accountId: c.account },
      contextVariables: c.context || {},
    },
    identityPolicies: c.policies.map((policy, i) => ({ name: `policy-${i}`, policy })),
    serviceControlPolicies: [], resourceControlPolicies: [],
    ...(c.resourcePolicy ? { resourcePolicy: c.resourcePolicy } : {}),
    }, {})
  } catch (e) {
    result = { errors: { message: String(e) } }
  }
  out.push(result.errors ? { errors: result.errors } : { decision: result.overallResult })
}
process.stdout.write(JSON.stringify(out))
